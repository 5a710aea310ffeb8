package main

import (
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/exercises/fakeupstream"
)

// A flood of one expired name while the upstream is dark: the refresh is
// one query, however many clients ask while it is out. Before, a query
// that found the refresh's flight full (maxFollowers) started a refresh of
// its own, so a dead upstream got one query per 65 clients during every
// refresh (seen black-box: 3000 queries/s at one expired name made 60
// queries to the dark upstream in 8 s, and every client waited
// DNS_CACHE_STALE_WAIT). Such a query has a stale answer and a refresh is
// already under way: it gets the stale answer at once.
func TestStaleRefreshFloodAsksOnce(t *testing.T) {
	const clients = 300
	a, up, clock := startCaching(t, func(c *Config) { c.UpstreamTimeout = 3 * time.Second })
	primeAndExpire(t, a, clock)
	up.SetMode(fakeupstream.Blackhole)

	conn, err := net.Dial("udp", a.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	send := func(id uint16) {
		q := query("www.example.com", dns.TypeA)
		q.Id = id
		q.SetEdns0(1232, false)
		b, err := q.Pack()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	send(0) // the refresh
	waitFor(t, "the refresh to reach the upstream", func() bool { return up.Total() == 2 })
	for id := 1; id < clients; id++ { // all within the refresh's 3 s
		send(uint16(id))
	}

	seen := make(map[uint16]bool)
	buf := make([]byte, 65535)
	deadline := time.Now().Add(10 * time.Second)
	for len(seen) < clients {
		conn.SetReadDeadline(deadline)
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("%d of %d clients answered: %v", len(seen), clients, err)
		}
		r := new(dns.Msg)
		if err := r.Unpack(buf[:n]); err != nil {
			t.Fatal(err)
		}
		wantStale(t, r)
		seen[r.Id] = true
	}
	if got := up.Total() - 1; got != 1 {
		t.Errorf("the dark upstream received %d refreshes for %d clients, want 1", got, clients)
	}
	if got := count(a, "A", "stale", clients); got != clients {
		t.Errorf("stale %d, want %d", got, clients)
	}
}

// A query for an expired name that comes after the client-response timer
// has answered its refresh's clients, while that refresh is still out, is
// answered stale at once and sends nothing. Before, the timer took the
// flight out of the table and the name was still only expired, so the
// query started a refresh of its own and waited the timer out again: with
// DNS_UPSTREAM_TIMEOUT=10s and the default 1.8 s timer, a dark upstream got
// 5 refreshes of one busy name in 9 s and every client waited 1.8 s
// (seen black-box).
func TestStaleAfterTimerWhileRefreshIsOut(t *testing.T) {
	a, up, clock := startCaching(t, func(c *Config) {
		c.UpstreamTimeout = 5 * time.Second
		c.CacheStaleWait = time.Second
	})
	primeAndExpire(t, a, clock)
	up.SetMode(fakeupstream.Blackhole)
	got := askWhileStaleWaits(t, a, clock)
	// The refresh is sent before the clients wait, but the upstream reads
	// it on its own goroutine: on a loaded machine the count below could
	// be taken before it did.
	waitFor(t, "the refresh to reach the upstream", func() bool { return up.Total() >= 2 })
	clock.Advance(time.Second)
	staleAfterTimer(t, got)

	q := query("www.example.com", dns.TypeA)
	q.SetEdns0(1232, false)
	r, err := tryAsk("udp", a.addr(), q, time.Second) // the refresh is out for 5 s
	if err != nil {
		t.Fatalf("the next client, while the refresh is out: %v; want a stale answer at once", err)
	}
	wantStale(t, r)
	if got := up.Total(); got != 2 {
		t.Errorf("the upstream received %d queries, want 2: the priming and one refresh", got)
	}
}
