package main

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
)

// An expired name asked by a crowd while its refresh is out, serve-stale
// on: the first asker refreshes, the next wait on it up to the proxy's
// bound on followers, and the rest, for whom no place is left, get the
// stale answer at once (not REFUSED, and nothing sent). When the
// client-response timer answers the waiters, their places are free again,
// before the refresh lands; when it lands, nothing more is given back.
func TestCrowdedExpiredNameIsAnsweredStale(t *testing.T) {
	const followerCap = 3
	up := startUpstream(t)
	cfg := withCache(testConfig(up.Addr()))
	cfg.UpstreamTimeout, cfg.CacheStaleWait = 5*time.Second, 1800*time.Millisecond
	clock := guard.NewManualClock(tc0)
	a, err := newApp(cfg, clock, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	a.proxy.followerCap = followerCap // before the server starts: no handler reads it yet
	if err := a.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.shutdown(ctx)
	})
	primeAndExpire(t, a, clock)
	gate, open := holdGate(t)
	up.SetScript(func(req *dns.Msg, _ string) [][]byte {
		<-gate
		b, _ := answerFor(req).Pack()
		return [][]byte{b}
	})

	const askers = 1 + followerCap + 4
	got := make(chan *dns.Msg, askers)
	for i := range askers {
		go func() {
			q := query("www.example.com", dns.TypeA)
			q.SetEdns0(1232, false)
			q.Id = uint16(i)
			r, _ := tryAsk("udp", a.addr(), q, 10*time.Second)
			got <- r
		}()
		if i == 0 {
			waitFor(t, "the refresh to reach the upstream", func() bool { return up.Total() == 2 })
		}
	}
	// The four beyond the bound are answered stale at once; the others wait.
	for range askers - 1 - followerCap {
		select {
		case r := <-got:
			if r == nil {
				t.Fatal("a client beyond the bound got no answer")
			}
			wantStale(t, r)
		case <-time.After(5 * time.Second):
			t.Fatal("the clients beyond the bound were not answered at once")
		}
	}
	waitFor(t, "the followers to be counted", func() bool { return a.proxy.followers.Load() == followerCap })
	if c := up.Total(); c != 2 {
		t.Fatalf("the upstream saw %d queries, want 2: the priming and the one refresh", c)
	}
	clock.Advance(1800 * time.Millisecond) // the client-response timer answers the waiters
	for range 1 + followerCap {
		select {
		case r := <-got:
			if r == nil {
				t.Fatal("a waiter got no answer")
			}
			wantStale(t, r)
		case <-time.After(5 * time.Second):
			t.Fatal("the waiters were not answered by the client-response timer")
		}
	}
	if n := a.proxy.followers.Load(); n != 0 {
		t.Fatalf("%d followers counted once the timer answered them all", n)
	}
	open()
	waitFor(t, "the refresh to land", func() bool {
		return metric(t, a, `dnsproxi_cache_refreshes_total{result="updated"}`) == 1
	})
	if n := a.proxy.followers.Load(); n != 0 {
		t.Fatalf("%d followers counted after the refresh landed: given back twice", n)
	}
}
