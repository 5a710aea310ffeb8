package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/dnsserver"
	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
)

// askEDNS asks name's A record with an OPT record, over UDP.
func askEDNS(t *testing.T, a *app, name string) *dns.Msg {
	t.Helper()
	q := query(name, dns.TypeA)
	q.SetEdns0(1232, false)
	return ask(t, "udp", a.addr(), q)
}

// wantStale fails unless r is a stale answer: NOERROR with its record,
// every TTL 30, and EDE 3 (Stale Answer).
func wantStale(t *testing.T, r *dns.Msg) {
	t.Helper()
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("%s %s, want the stale answer", rcodeName(r), answerText(r))
	}
	if got := ttls(r); len(got) != 1 || got[0] != 30 {
		t.Errorf("TTLs %v, want [30] (RFC 8767 §4)", got)
	}
	if got := edeCodes(r); len(got) != 1 || got[0] != dns.ExtendedErrorCodeStaleAnswer {
		t.Errorf("EDE %v, want [3] Stale Answer", got)
	}
}

// primeAndExpire stores www.example.com (TTL 60) and moves the clock past
// its expiry, within the stale window.
func primeAndExpire(t *testing.T, a *app, clock *guard.ManualClock) {
	t.Helper()
	if r := askEDNS(t, a, "www.example.com"); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("priming: %s %s", rcodeName(r), answerText(r))
	}
	clock.Advance(61 * time.Second)
}

// Every trigger of a stale answer, the name expired: the refresh fails (no
// reply: a failure), the refresh is answered SERVFAIL, the breaker is open,
// the in-flight cap is full, the outbound limit has no token. In the last
// three nothing is sent upstream.
func TestStaleTriggers(t *testing.T) {
	tests := []struct {
		name    string
		change  func(*Config)
		setup   func(t *testing.T, a *app, up *fakeupstream.Server)
		sent    int64  // queries the upstream receives for the stale one
		refresh string // the refresh result counted
	}{
		{"refresh fails", nil, func(t *testing.T, a *app, up *fakeupstream.Server) {
			up.SetMode(fakeupstream.Blackhole)
		}, 1, "failed"},
		{"refresh SERVFAIL", nil, func(t *testing.T, a *app, up *fakeupstream.Server) {
			up.SetMode(fakeupstream.ServFail)
		}, 1, "failed"},
		{"breaker open", func(c *Config) {
			c.BreakerThreshold, c.BreakerMinSamples, c.BreakerWindow, c.BreakerCoolOff = 50, 1, 1, time.Hour
		}, func(t *testing.T, a *app, up *fakeupstream.Server) {
			up.SetMode(fakeupstream.Blackhole)
			if r := askEDNS(t, a, "unknown.example.com"); r.Rcode != dns.RcodeServerFailure {
				t.Fatalf("unknown name: %s", rcodeName(r))
			}
			waitFor(t, "the breaker to open", func() bool { return a.breaker(0).State() == guard.Open })
		}, 0, "refused"},
		{"in-flight cap full", func(c *Config) { c.MaxInflight = 1 }, func(t *testing.T, a *app, up *fakeupstream.Server) {
			gate, open := holdGate(t)
			up.SetScript(func(*dns.Msg, string) [][]byte { <-gate; return nil })
			sent := up.Total()
			done := make(chan struct{})
			go func() {
				defer close(done)
				tryAsk("udp", a.addr(), query("held.example.com", dns.TypeA), 3*time.Second)
			}()
			t.Cleanup(func() { open(); <-done })
			// Held at the upstream too, so that it is not counted among
			// what the stale query sends.
			waitFor(t, "the held query to take the one place", func() bool {
				return a.proxy.inflight.Load() == 1 && up.Total() == sent+1
			})
		}, 0, "refused"},
		{"outbound limit spent", func(c *Config) { c.UpstreamRateLimit = RateLimit{Rate: 0.001, Burst: 1} },
			func(t *testing.T, a *app, up *fakeupstream.Server) {}, 0, "refused"}, // priming took the one token
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, up, clock := startCaching(t, tt.change)
			primeAndExpire(t, a, clock)
			tt.setup(t, a, up)
			before := up.Total()
			wantStale(t, askEDNS(t, a, "www.example.com"))
			if sent := up.Total() - before; sent != tt.sent {
				t.Errorf("the upstream received %d queries for the stale name, want %d", sent, tt.sent)
			}
			if got := count(a, "A", "stale", 1); got != 1 {
				t.Errorf("stale %d, want 1", got)
			}
			if got := metric(t, a, `dnsproxi_cache_refreshes_total{result="`+tt.refresh+`"}`); got != 1 {
				t.Errorf("refreshes %s = %v, want 1", tt.refresh, got)
			}
		})
	}
}

// The client-response timer: a refresh that has not come back within
// DNS_CACHE_STALE_WAIT (on the cache's clock) is answered stale, and the
// refresh still completes and updates the entry.
func TestStaleWaitTimerThenRefreshUpdates(t *testing.T) {
	a, up, clock := startCaching(t, func(c *Config) {
		c.UpstreamTimeout = 5 * time.Second
		c.CacheStaleWait = 1800 * time.Millisecond
	})
	primeAndExpire(t, a, clock)
	gate, open := holdGate(t)
	up.SetScript(func(req *dns.Msg, _ string) [][]byte {
		<-gate
		m := fakeupstream.Answer(req)
		m.Answer[0].(*dns.A).A = net.IPv4(192, 0, 2, 99)
		b, _ := m.Pack()
		return [][]byte{b}
	})
	got := askWhileStaleWaits(t, a, clock)
	select {
	case r := <-got:
		t.Fatalf("answered before the timer: %v", r)
	default:
	}
	clock.Advance(1799 * time.Millisecond)
	select {
	case r := <-got:
		t.Fatalf("answered 1 ms before the timer: %v", r)
	case <-time.After(50 * time.Millisecond): // a wrong early answer would come at once; this only bounds the look
	}
	clock.Advance(time.Millisecond)
	var r *dns.Msg
	select {
	case r = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("no stale answer after the client-response timer")
	}
	if r == nil {
		t.Fatal("the client got no answer")
	}
	wantStale(t, r)
	open() // the refresh comes back now, after its client was answered
	waitFor(t, "the refresh to update the entry", func() bool {
		return metric(t, a, `dnsproxi_cache_refreshes_total{result="updated"}`) == 1
	})
	fresh := askEDNS(t, a, "www.example.com")
	if len(fresh.Answer) != 1 || !fresh.Answer[0].(*dns.A).A.Equal(net.IPv4(192, 0, 2, 99)) || fresh.Answer[0].Header().Ttl != 60 {
		t.Errorf("after the refresh: %s, want the new address, TTL 60", answerText(fresh))
	}
	if len(edeCodes(fresh)) != 0 {
		t.Errorf("a fresh answer with EDE %v", edeCodes(fresh))
	}
	if got := count(a, "A", "stale", 1); got != 1 {
		t.Errorf("stale %d, want 1", got)
	}
	if got := count(a, "A", "cached", 1); got != 1 {
		t.Errorf("cached %d, want 1", got)
	}
}

// After a failed refresh the name is answered stale at once, without
// asking, for 30 s (RFC 8767's failure-recheck timer); then it is refreshed
// again, and a healed upstream's answer is served fresh.
func TestStaleRecheckTimer(t *testing.T) {
	a, up, clock := startCaching(t, nil)
	primeAndExpire(t, a, clock)
	up.SetMode(fakeupstream.ServFail)
	wantStale(t, askEDNS(t, a, "www.example.com")) // the refresh fails
	if up.Total() != 2 {
		t.Fatalf("the upstream received %d queries, want the priming and one refresh", up.Total())
	}
	up.SetMode(fakeupstream.OK)
	for _, step := range []time.Duration{0, 10 * time.Second, 19*time.Second + 999*time.Millisecond} {
		clock.Advance(step)
		wantStale(t, askEDNS(t, a, "www.example.com"))
	}
	if up.Total() != 2 {
		t.Fatalf("the upstream received %d queries within the recheck timer, want none more", up.Total()-2)
	}
	clock.Advance(time.Millisecond) // 30 s after the failure
	r := askEDNS(t, a, "www.example.com")
	if up.Total() != 3 || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 || r.Answer[0].Header().Ttl != 60 || len(edeCodes(r)) != 0 {
		t.Errorf("after the recheck timer: upstream received %d, answer %s %v EDE %v; want a refresh and a fresh answer",
			up.Total(), rcodeName(r), ttls(r), edeCodes(r))
	}
	if got := count(a, "A", "stale", 4); got != 4 {
		t.Errorf("stale %d, want 4", got)
	}
}

// A stale negative answer carries EDE 19 (Stale NXDOMAIN Answer); a client
// that sent no OPT gets none, and the TTL is 30 all the same.
func TestStaleNXDomainEDE19AndNoEDNS(t *testing.T) {
	a, up, clock := startCaching(t, nil)
	up.SetScript(func(req *dns.Msg, network string) [][]byte {
		if !strings.EqualFold(req.Question[0].Name, "gone.example.com.") { // the upstream sees 0x20's mixed case
			b, _ := fakeupstream.Answer(req).Pack()
			return [][]byte{b}
		}
		return nxWithSOA(req, network)
	})
	askEDNS(t, a, "gone.example.com")
	ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA)) // no EDNS: a key of its own
	clock.Advance(901 * time.Second)
	up.SetScript(nil)
	up.SetMode(fakeupstream.ServFail)

	r := askEDNS(t, a, "gone.example.com")
	if r.Rcode != dns.RcodeNameError || len(r.Ns) != 1 || r.Ns[0].Header().Ttl != 30 {
		t.Errorf("stale NXDOMAIN: %s, authority %v; want NXDOMAIN, the SOA at TTL 30", rcodeName(r), r.Ns)
	}
	if got := edeCodes(r); len(got) != 1 || got[0] != dns.ExtendedErrorCodeStaleNXDOMAINAnswer {
		t.Errorf("EDE %v, want [19]", got)
	}
	plain := ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA))
	if plain.IsEdns0() != nil || len(plain.Answer) != 1 || plain.Answer[0].Header().Ttl != 30 {
		t.Errorf("stale answer to a client without EDNS: OPT %v, %s", plain.IsEdns0(), answerText(plain))
	}
	if got := count(a, "A", "stale", 2); got != 2 {
		t.Errorf("stale %d, want 2", got)
	}
}

// Past the stale window, and for a name never seen, the client gets what
// it got before the cache: SERVFAIL from a failing upstream.
func TestStaleWindowEnds(t *testing.T) {
	a, up, clock := startCaching(t, func(c *Config) { c.CacheStale = 10 * time.Minute })
	primeAndExpire(t, a, clock)
	clock.Advance(10 * time.Minute) // 60 s + 10 min + 1 s: past the window
	up.SetMode(fakeupstream.ServFail)
	for _, name := range []string{"www.example.com", "never.example.com"} {
		if r := askEDNS(t, a, name); r.Rcode != dns.RcodeServerFailure || len(edeCodes(r)) != 0 {
			t.Errorf("%s: %s EDE %v, want the upstream's SERVFAIL", name, rcodeName(r), edeCodes(r))
		}
	}
	if got := count(a, "A", "stale", 0); got != 0 {
		t.Errorf("stale %d, want 0", got)
	}
}

// Prefetch: the first hit in the last tenth of an entry's TTL is answered
// from the cache and refreshes the entry in the background, once; hits
// before that tenth, and after the one that fired, send nothing.
func TestPrefetchFiresOnce(t *testing.T) {
	a, up, clock := startCaching(t, func(c *Config) { c.CachePrefetch = true })
	askEDNS(t, a, "www.example.com") // TTL 60: its last tenth starts at 54 s
	clock.Advance(53 * time.Second)
	if r := askEDNS(t, a, "www.example.com"); ttls(r)[0] != 7 || up.Total() != 1 {
		t.Fatalf("at 53 s: TTL %v, upstream %d; want 7 from the cache and no prefetch", ttls(r), up.Total())
	}
	clock.Advance(time.Second)
	if r := askEDNS(t, a, "www.example.com"); ttls(r)[0] != 6 {
		t.Fatalf("at 54 s: TTL %v, want 6 from the cache", ttls(r))
	}
	waitFor(t, "the prefetch to update the entry", func() bool {
		return metric(t, a, `dnsproxi_cache_refreshes_total{result="updated"}`) == 1
	})
	if up.Total() != 2 {
		t.Fatalf("the upstream received %d queries, want the priming and one prefetch", up.Total())
	}
	clock.Advance(time.Second)
	for range 3 {
		if r := askEDNS(t, a, "www.example.com"); ttls(r)[0] != 59 {
			t.Fatalf("after the prefetch: TTL %v, want 59 from the new entry", ttls(r))
		}
	}
	if up.Total() != 2 {
		t.Errorf("the upstream received %d queries, want no second prefetch", up.Total())
	}
	if got := count(a, "A", "cached", 5); got != 5 {
		t.Errorf("cached %d, want 5: a prefetch counts no query of its own", got)
	}
	if got := count(a, "A", "forwarded", 1); got != 1 {
		t.Errorf("forwarded %d, want 1", got)
	}
}

// The client-response timer and the completion race for the same waiters
// on real timers: whichever comes first answers them, and every client gets
// exactly one answer. Run with -race.
func TestStaleTimerAndCompletionAnswerOnce(t *testing.T) {
	up := startUpstream(t)
	cfg := withCache(testConfig(up.Addr()))
	cfg.CacheStaleWait = 3 * time.Millisecond
	cfg.UpstreamTimeout = 2 * time.Second
	manual := guard.NewManualClock(tc0)
	a, err := newApp(cfg, nowOnly{manual}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.upstreams.Close() })
	client := netip.MustParseAddrPort("127.0.0.1:5353")
	srv := &dnsserver.Server{Handler: dnsserver.HandlerFunc(func(w dnsserver.ResponseWriter, q *dnsserver.Query) {
		q.Client = client
		a.proxy.handleQuery(w, q)
	})}
	const names, rounds = 40, 8
	pkt := func(i int) []byte {
		b, err := query(fmt.Sprintf("n%d.example.com", i), dns.TypeA).Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for i := range names {
		w := &waitingRecorder{done: make(chan struct{})}
		srv.ServePacket(w, pkt(i))
		<-w.done
	}
	up.SetDelay(3 * time.Millisecond) // the refresh lands about when the timer fires
	up.SetMode(fakeupstream.Slow)
	var wg sync.WaitGroup
	var recs []*waitingRecorder
	for range rounds {
		manual.Advance(61 * time.Second) // every entry expired, refreshed ones too
		for i := range names {
			w := &waitingRecorder{done: make(chan struct{})}
			recs = append(recs, w)
			b := pkt(i)
			wg.Go(func() { srv.ServePacket(w, b) })
		}
	}
	wg.Wait()
	for i, w := range recs {
		select {
		case <-w.done:
		case <-time.After(5 * time.Second):
			t.Fatalf("query %d: no answer within 5 s", i)
		}
	}
	// Every answer is counted once, after it is written: wait for them all,
	// and for every exchange to end, then look for a second answer.
	want := names + len(recs)
	deadline := time.Now().Add(5 * time.Second)
	for outcomeTotal(a, "forwarded")+outcomeTotal(a, "stale")+outcomeTotal(a, "cached") < want || a.proxy.inflight.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s: forwarded %d, stale %d, cached %d, upstream_error %d of %d; %d in flight", outcomeTotal(a, "forwarded"),
				outcomeTotal(a, "stale"), outcomeTotal(a, "cached"), outcomeTotal(a, "upstream_error"), want, a.proxy.inflight.Load())
		}
		time.Sleep(time.Millisecond)
	}
	for i, w := range recs {
		w.mu.Lock()
		n, d := len(w.out), w.dropped
		w.mu.Unlock()
		if n != 1 || d != 0 {
			t.Fatalf("query %d: %d answers and %d drops, want exactly one answer", i, n, d)
		}
	}
	if got := outcomeTotal(a, "forwarded") + outcomeTotal(a, "stale") + outcomeTotal(a, "cached"); got != want {
		t.Errorf("%d answers counted for %d queries", got, want)
	}
	t.Logf("stale %d (timer or failure), forwarded %d, cached %d", outcomeTotal(a, "stale"), outcomeTotal(a, "forwarded")-names, outcomeTotal(a, "cached"))
}

// nowOnly is a clock that reads a manual clock's time but has no timers of
// its own, so the stale-wait timer runs on real time.
type nowOnly struct{ c *guard.ManualClock }

func (n nowOnly) Now() time.Time { return n.c.Now() }

// askWhileStaleWaits asks for www.example.com with EDNS, an expired name
// whose refresh the upstream holds, and returns once the client-response
// timer is armed on clock: the answer comes on the channel.
func askWhileStaleWaits(t *testing.T, a *app, clock *guard.ManualClock) <-chan *dns.Msg {
	t.Helper()
	got := make(chan *dns.Msg, 1)
	go func() {
		q := query("www.example.com", dns.TypeA)
		q.SetEdns0(1232, false)
		r, _ := tryAsk("udp", a.addr(), q, 5*time.Second)
		got <- r
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := clock.BlockUntilWaiters(ctx, 1); err != nil {
		t.Fatal("the stale-wait timer was never armed:", err)
	}
	return got
}

// answerWithin5s returns the answer got delivers, failing the test (what
// names the client) if none comes within 5 s.
func answerWithin5s(t *testing.T, what string, got <-chan *dns.Msg) *dns.Msg {
	t.Helper()
	select {
	case r := <-got:
		return r
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: no answer within 5 s", what)
		return nil
	}
}

// staleAfterTimer waits for the answer askWhileStaleWaits asked for, once
// the test has advanced the clock past the client-response timer, and
// wants it stale.
func staleAfterTimer(t *testing.T, got <-chan *dns.Msg) {
	t.Helper()
	select {
	case r := <-got:
		if r == nil {
			t.Fatal("the first client got no answer")
		}
		wantStale(t, r)
	case <-time.After(5 * time.Second):
		t.Fatal("no stale answer after the client-response timer")
	}
}
