package main

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/exercises/fakeupstream"
)

// flightsOut counts the flights in both of p's tables.
func flightsOut(p *proxy) int {
	n := 0
	for i := range p.flights {
		for s := range p.flights[i] {
			sh := &p.flights[i][s]
			sh.mu.Lock()
			for _, g := range sh.heads {
				for ; g != nil; g = g.next {
					n++
				}
			}
			sh.mu.Unlock()
		}
	}
	return n
}

// Round after round, one expired name asked by many clients at once over
// UDP and TCP while its refreshes (one a network) hang: the flood joins
// them or, past maxFollowers, is answered stale at once; the
// client-response timer (manual clock) answers the joiners stale and closes
// the flights; a second flood, while the refreshes are still out, is
// answered stale at once and sends nothing; then the upstream answers, the
// flights leave the table, and the name is fresh from the cache. Every
// client gets exactly one answer, each outcome counted once, and the
// upstream gets one refresh a network a round. Run with -race.
func TestStaleFiredFloodRoundsUDPAndTCP(t *testing.T) {
	const rounds, udpClients, tcpClients = 4, 120, 24
	a, up, clock := startCaching(t, func(c *Config) {
		c.UpstreamTimeout = 10 * time.Second
		c.CacheStaleWait = time.Second
	})
	var gate atomic.Pointer[chan struct{}]
	var round atomic.Int64
	up.SetScript(func(req *dns.Msg, _ string) [][]byte {
		if g := gate.Load(); g != nil {
			<-*g
		}
		m := fakeupstream.Answer(req)
		m.Answer[0].(*dns.A).A = net.IPv4(192, 0, 2, byte(100+round.Load()))
		b, _ := m.Pack()
		return [][]byte{b}
	})
	primeAndExpire(t, a, clock)

	ask := func(network string, id uint16) (*dns.Msg, error) {
		q := query("www.example.com", dns.TypeA)
		q.Id = id
		q.SetEdns0(1232, false)
		return tryAsk(network, a.addr(), q, 3*time.Second)
	}
	var bad atomic.Int64
	var firstBad atomic.Value
	fail := func(format string, args ...any) {
		if bad.Add(1) == 1 {
			firstBad.Store(fmt.Sprintf(format, args...))
		}
	}
	flood := func(wg *sync.WaitGroup, what string) {
		for c := range udpClients + tcpClients {
			network := "udp"
			if c >= udpClients {
				network = "tcp"
			}
			wg.Go(func() {
				r, err := ask(network, uint16(c))
				switch {
				case err != nil:
					fail("%s, %s client %d: %v", what, network, c, err)
				case r.Id != uint16(c):
					fail("%s, %s client %d: ID %d", what, network, c, r.Id)
				case r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || len(ttls(r)) != 1 || ttls(r)[0] != 30:
					fail("%s, %s client %d: %s %s TTL %v, want the stale answer", what, network, c, rcodeName(r), answerText(r), ttls(r))
				}
			})
		}
	}
	stale := 0
	for n := range rounds {
		round.Store(int64(n))
		ch := make(chan struct{})
		gate.Store(&ch)
		sent := up.Total()
		// The two refreshes, one a network, held at the upstream.
		var first sync.WaitGroup
		for i, network := range []string{"udp", "tcp"} {
			first.Go(func() {
				if r, err := ask(network, uint16(60000+i)); err != nil || len(ttls(r)) != 1 || ttls(r)[0] != 30 {
					fail("round %d, the %s refresh's client: %v %v, want the stale answer", n, network, err, r)
				}
			})
		}
		waitFor(t, "the refreshes to reach the upstream", func() bool { return up.Total() == sent+2 })
		var wg sync.WaitGroup
		flood(&wg, fmt.Sprintf("round %d, before the timer", n))
		// The joiners wait for the timers; those past maxFollowers are
		// answered at once. Wait for both timers, then fire them.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := clock.BlockUntilWaiters(ctx, 2)
		cancel()
		if err != nil {
			t.Fatalf("round %d: the two timers were never armed: %v", n, err)
		}
		waitFor(t, "the flood to be in the air", func() bool {
			return a.proxy.inflight.Load() == 2 // nothing but the two refreshes went upstream
		})
		clock.Advance(time.Second)
		first.Wait()
		wg.Wait()
		// While the refreshes are out, closed to joiners: stale at once.
		flood(&wg, fmt.Sprintf("round %d, after the timer", n))
		wg.Wait()
		if got := up.Total() - sent; got != 2 {
			t.Fatalf("round %d: the upstream received %d refreshes, want 2 (one a network)", n, got)
		}
		if got := flightsOut(a.proxy); got != 2 {
			t.Fatalf("round %d: %d flights in the tables while the refreshes are out, want 2", n, got)
		}
		stale += 2 + 2*(udpClients+tcpClients)

		close(ch) // the upstream answers
		waitFor(t, "the refreshes to land", func() bool { return a.proxy.inflight.Load() == 0 && flightsOut(a.proxy) == 0 })
		for _, network := range []string{"udp", "tcp"} {
			r, err := ask(network, 1)
			if err != nil || len(r.Answer) != 1 || !r.Answer[0].(*dns.A).A.Equal(net.IPv4(192, 0, 2, byte(100+n))) || ttls(r)[0] == 30 {
				t.Fatalf("round %d, %s after the refresh landed: %v %v, want the fresh answer", n, network, err, r)
			}
		}
		if got := up.Total() - sent; got != 2 {
			t.Fatalf("round %d: the upstream received %d queries, want the 2 refreshes", n, got)
		}
		clock.Advance(61 * time.Second) // expired again
	}
	if n := bad.Load(); n > 0 {
		t.Fatalf("%d clients got no answer or a wrong one; first: %v", n, firstBad.Load())
	}
	if got := count(a, "A", "stale", stale); got != stale {
		t.Errorf("stale %d, want %d: one answer a client", got, stale)
	}
}
