package main

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
)

// sendAll writes the queries to c at once, without waiting for answers.
func sendAll(t *testing.T, c net.Conn, qs []*dns.Msg) {
	t.Helper()
	for _, m := range qs {
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
	}
}

// readRcodes reads one reply per query in qs from c (5 s at most in all)
// and returns how many came back with each rcode.
func readRcodes(t *testing.T, c net.Conn, qs []*dns.Msg) map[int]int {
	t.Helper()
	want := map[uint16]bool{}
	for _, m := range qs {
		want[m.Id] = true
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 65535)
	got := map[int]int{}
	for len(want) > 0 {
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("%d queries unanswered: %v", len(want), err)
		}
		r := new(dns.Msg)
		if err := r.Unpack(buf[:n]); err != nil || !want[r.Id] {
			t.Fatalf("a reply that answers none of the queries (ID %d, %v)", r.Id, err)
		}
		delete(want, r.Id)
		got[r.Rcode]++
	}
	return got
}

// Confirmed by the review: twenty queries for a name whose authority is slow
// time out and the breaker opens, so every client gets SERVFAIL. A breaker
// must detect a dead upstream, not a slow name: 40 slow names while others
// are answered leave it closed, and a blackholed upstream still opens it
// within MinSamples queries.
func TestSlowNamesDoNotOpenTheBreaker(t *testing.T) {
	up := startUpstream(t)
	cfg := testConfig(up.Addr())
	cfg.UpstreamTimeout = 500 * time.Millisecond
	cfg.BreakerThreshold, cfg.BreakerMinSamples, cfg.BreakerWindow = 50, 20, 100
	up.SetDelay(2 * cfg.UpstreamTimeout) // a name under "slow." is answered after the deadline
	clock := guard.NewManualClock(time.Now())
	a := startProxy(t, cfg, clock)
	c, err := net.Dial("udp", a.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	opened := func() int {
		return int(testutil.ToFloat64(a.metrics.BreakerChanges.WithLabelValues(up.Addr(), "closed", "open")))
	}

	// 4 rounds: 10 slow names go out, one other name is answered while they
	// wait, then the 10 time out, each with SERVFAIL for its client.
	const rounds, slowPerRound = 4, 10
	for r := range rounds {
		var slow []*dns.Msg
		for i := range slowPerRound {
			m := query(fmt.Sprintf("slow.r%d-%d.example.com", r, i), dns.TypeA)
			m.Id = uint16(r*slowPerRound + i + 1)
			slow = append(slow, m)
		}
		before := up.Total()
		sendAll(t, c, slow)
		waitFor(t, "the slow names to reach the upstream", func() bool { return up.Total() == before+slowPerRound })
		if m := ask(t, "udp", a.addr(), query(fmt.Sprintf("n%d.example.com", r), dns.TypeA)); m.Rcode != dns.RcodeSuccess {
			t.Fatalf("round %d: the neighbour got %s, want NOERROR", r, rcodeName(m))
		}
		if got := readRcodes(t, c, slow); got[dns.RcodeServerFailure] != slowPerRound {
			t.Fatalf("round %d: slow names got rcodes %v, want %d SERVFAIL (after the timeout)", r, got, slowPerRound)
		}
		if s := a.breaker(0).State(); s != guard.Closed {
			t.Fatalf("round %d: breaker %v after %d slow names among answered neighbours, want closed",
				r, s, (r+1)*slowPerRound)
		}
	}
	if got := count(a, "A", "upstream_error", rounds*slowPerRound); got != rounds*slowPerRound {
		t.Errorf("upstream_error %d, want %d: every slow name still gets SERVFAIL", got, rounds*slowPerRound)
	}
	if got := count(a, "A", "forwarded", rounds); got != rounds {
		t.Errorf("forwarded %d, want the %d neighbours", got, rounds)
	}
	if n, refused := opened(), count(a, "A", "breaker_open", 0); n != 0 || refused != 0 {
		t.Fatalf("breaker opened %d times and refused %d queries during the slow names, want 0 and 0", n, refused)
	}

	// The whole upstream goes dark: MinSamples queries at once, nothing
	// answered while they wait, and the breaker opens.
	up.SetMode(fakeupstream.Blackhole)
	var dark []*dns.Msg
	for i := range cfg.BreakerMinSamples {
		m := query(fmt.Sprintf("d%d.example.com", i), dns.TypeA)
		m.Id = uint16(1000 + i)
		dark = append(dark, m)
	}
	sendAll(t, c, dark)
	if got := readRcodes(t, c, dark); got[dns.RcodeServerFailure] != len(dark) {
		t.Fatalf("blackholed: rcodes %v, want %d SERVFAIL", got, len(dark))
	}
	if s := a.breaker(0).State(); s != guard.Open || opened() != 1 {
		t.Fatalf("after %d timeouts at a blackholed upstream: breaker %v, opened %d times; want open, once",
			len(dark), s, opened())
	}
	before := up.Total()
	if m := ask(t, "udp", a.addr(), query("after.example.com", dns.TypeA)); m.Rcode != dns.RcodeServerFailure {
		t.Fatalf("open breaker: %s, want SERVFAIL", rcodeName(m))
	}
	if got := count(a, "A", "breaker_open", 1); got != 1 || up.Total() != before {
		t.Fatalf("breaker_open %d, upstream received %d more; want 1 and 0", got, up.Total()-before)
	}
}
