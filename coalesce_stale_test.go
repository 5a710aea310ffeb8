package main

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
)

// A query for an expired name (serve-stale on) while a prefetch of the
// name, started when it was fresh, is still in the air: the prefetch's
// flight holds no expired entry, so a query that joined it lost its own
// and got SERVFAIL when the refresh failed (it did, before join looked at
// the fallback). It refreshes on its own and gets the stale answer
// (TestStaleTriggers, "refresh fails").
func TestExpiredQueryDoesNotJoinAFlightWithoutFallback(t *testing.T) {
	a, up, clock := startCaching(t, func(c *Config) {
		c.CachePrefetch = true
		c.UpstreamTimeout = 2 * time.Second
	})
	askEDNS(t, a, "www.example.com") // TTL 60: prefetch from 54 s
	up.SetMode(fakeupstream.Blackhole)
	clock.Advance(55 * time.Second)
	if r := askEDNS(t, a, "www.example.com"); r.Rcode != dns.RcodeSuccess || ttls(r)[0] != 5 {
		t.Fatalf("at 55 s: %s TTL %v, want NOERROR from the cache, TTL 5", rcodeName(r), ttls(r))
	}
	waitFor(t, "the prefetch to reach the upstream", func() bool { return up.Total() == 2 })
	clock.Advance(6 * time.Second) // expired, well within the stale window; the prefetch is still out
	r := askEDNS(t, a, "www.example.com")
	wantStale(t, r)
	if c := testutil.ToFloat64(a.metrics.Coalesced); c != 0 {
		t.Fatalf("coalesced %v, want 0: the expired query joined the prefetch", c)
	}
	if got := up.Total(); got != 3 {
		t.Fatalf("upstream saw %d queries, want 3: the first, the prefetch, the expired query's own refresh", got)
	}
}

// Many clients ask a few names at once, over UDP and TCP, each in a case of
// its own, through the cache (stale, a 5 ms client-response timer,
// prefetch) and two hedged upstreams that answer late, twice, or not at
// all, on real timers. Every client gets exactly its own answer: its ID,
// its question byte for byte, its name's record, nothing else. Run with
// -race.
func TestMixedFloodEachGetsItsOwnAnswer(t *testing.T) {
	ups := []*fakeupstream.Server{startUpstream(t), startUpstream(t)}
	names := []string{"a.example.com.", "bb.example.com.", "ccc.example.com."}
	addrOf := func(name string) net.IP {
		for i, n := range names {
			if strings.EqualFold(n, name) {
				return net.IPv4(192, 0, 2, byte(10+i))
			}
		}
		return net.IPv4(0, 0, 0, 0)
	}
	var turn atomic.Int64
	for _, up := range ups {
		up.SetScript(func(req *dns.Msg, _ string) [][]byte {
			m := fakeupstream.Answer(req)
			if len(m.Answer) == 1 {
				m.Answer[0].Header().Ttl = 1
				m.Answer[0].(*dns.A).A = addrOf(req.Question[0].Name)
			}
			b, _ := m.Pack()
			switch turn.Add(1) % 5 {
			case 0:
				return nil // silent
			case 1:
				time.Sleep(20 * time.Millisecond) // late: past the timer, maybe past the hedge
			case 2:
				return [][]byte{b, b} // twice
			}
			return [][]byte{b}
		})
	}
	cfg := withCache(testConfig(ups[0].Addr() + "," + ups[1].Addr()))
	cfg.UpstreamTimeout = 300 * time.Millisecond
	cfg.CacheStaleWait = 5 * time.Millisecond
	cfg.CachePrefetch = true
	cfg.UpstreamHedge = Hedge{After: 10 * time.Millisecond, Given: true}
	a := startProxy(t, cfg, guard.RealClock{})

	mixCase := func(s string, r *rand.Rand) string {
		b := []byte(s)
		for i, c := range b {
			if c >= 'a' && c <= 'z' && r.IntN(2) == 0 {
				b[i] = c - 'a' + 'A'
			}
		}
		return string(b)
	}
	const rounds, clients = 8, 48
	var bad atomic.Int64
	var firstBad atomic.Value
	fail := func(format string, args ...any) {
		if bad.Add(1) == 1 {
			firstBad.Store(fmt.Sprintf(format, args...))
		}
	}
	for round := range rounds {
		var wg sync.WaitGroup
		for c := range clients {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(round), uint64(c)))
				name := mixCase(names[c%len(names)], r)
				network := "udp"
				if c%3 == 0 {
					network = "tcp"
				}
				q := query(name, dns.TypeA)
				if c%2 == 0 {
					q.SetEdns0(1232, false)
				}
				resp, err := tryAsk(network, a.addr(), q, 2*time.Second)
				switch {
				case err != nil:
					fail("%s %s: %v", network, name, err)
				case resp.Id != q.Id:
					fail("%s %s: ID %d, want %d", network, name, resp.Id, q.Id)
				case len(resp.Question) != 1 || resp.Question[0].Name != name:
					fail("%s %s: question %v", network, name, resp.Question)
				case resp.Rcode == dns.RcodeServerFailure:
				case resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1:
					fail("%s %s: %s %s", network, name, rcodeName(resp), answerText(resp))
				case !strings.EqualFold(resp.Answer[0].Header().Name, name) || !resp.Answer[0].(*dns.A).A.Equal(addrOf(name)):
					fail("%s %s: another's record: %s", network, name, answerText(resp))
				}
			})
		}
		wg.Wait()
		time.Sleep(350 * time.Millisecond) // real time passing, so TTL 1 reaches its last tenth and expires; not a wait for an event
	}
	if n := bad.Load(); n > 0 {
		t.Fatalf("%d of %d clients got a wrong answer or none; first: %v", n, rounds*clients, firstBad.Load())
	}
	waitFor(t, "every query to leave the upstreams", func() bool { return a.proxy.inflight.Load() == 0 })
	t.Logf("coalesced %v, stale %d, cached %d, forwarded %d, upstream_error %d", testutil.ToFloat64(a.metrics.Coalesced),
		outcomeTotal(a, "stale"), outcomeTotal(a, "cached"), outcomeTotal(a, "forwarded"), outcomeTotal(a, "upstream_error"))
}
