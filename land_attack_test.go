package main

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dnsproxi/guard"
)

// Attacks on a flight's landing (land, proxy.go): its answer goes into the
// cache, then the flight leaves the table, then its waiters are read. The
// test hook proxy.landing runs between the first two; each test places
// queries there, on the rig of coalesce_attack_test.go (a held upstream,
// clients that record every answer), and checks that every client is
// answered exactly once, the upstream is asked no more than it must be,
// and the counters add up with nothing left in flight.

// landedAddr is the address in the answers the tests land, so that an
// answer from the landing flight (or from the cache it filled) is told
// apart from one the cache held before (fakeupstream's 192.0.2.1).
var landedAddr = net.IPv4(192, 0, 2, 99).To4()

// duringLanding makes fn run once, inside the next flight to land, between
// its answer going into the cache and its leaving the table.
func (r *lateRig) duringLanding(t *testing.T, fn func()) *atomic.Bool {
	t.Helper()
	ran := new(atomic.Bool)
	hook := func() {
		if ran.CompareAndSwap(false, true) {
			fn()
		}
	}
	r.p.landing.Store(&hook)
	t.Cleanup(func() { r.p.landing.Store(nil) })
	return ran
}

// endWith ends every query h holds: with what reply builds for it, or, if
// reply is nil, with err and no reply.
func (h *heldForwarder) endWith(reply func(req *dns.Msg) []byte, err error) {
	h.mu.Lock()
	held := h.held
	h.held = nil
	h.mu.Unlock()
	for _, s := range held {
		if reply == nil {
			s.done(s.query, nil, err)
			continue
		}
		req := new(dns.Msg)
		if err := req.Unpack(s.query); err != nil {
			panic(err)
		}
		s.done(s.query, reply(req), nil)
	}
}

// landed is the upstream's answer with landedAddr, changed by edit if set.
func landed(edit func(m *dns.Msg)) func(req *dns.Msg) []byte {
	return zone(func(_, m *dns.Msg) {
		for _, rr := range m.Answer {
			if a, ok := rr.(*dns.A); ok {
				a.A = landedAddr
			}
		}
		if edit != nil {
			edit(m)
		}
	})
}

// withRcode is an edit that makes the answer an empty one with rcode.
func withRcode(rcode int) func(m *dns.Msg) {
	return func(m *dns.Msg) { m.Rcode, m.Answer = rcode, nil }
}

// returnedNow waits, without failing at once (it may run inside a
// landing, on a goroutine the test does not own), for w's handler to
// return.
func returnedNow(t *testing.T, what string, w *lateWriter) bool {
	t.Helper()
	select {
	case <-w.returned:
		return true
	case <-time.After(5 * time.Second):
		t.Errorf("timed out waiting for %s's handler to return", what)
		return false
	}
}

// doneNow waits, as returnedNow does, for w's first answer.
func doneNow(t *testing.T, what string, w *lateWriter) bool {
	t.Helper()
	select {
	case <-w.done:
		return true
	case <-time.After(5 * time.Second):
		t.Errorf("timed out waiting for %s's answer", what)
		return false
	}
}

// kind names what m is: "stale" (TTL 30), "landed" (the answer with
// landedAddr), "old" (the one the cache held before), "tc", or its rcode.
func kind(m *dns.Msg) string {
	switch {
	case m.Truncated:
		return "tc"
	case m.Rcode != dns.RcodeSuccess:
		return rcodeName(m)
	case isStale(m):
		return "stale"
	case len(m.Answer) != 1:
		return "empty"
	}
	a, ok := m.Answer[0].(*dns.A)
	switch {
	case !ok:
		return "not A"
	case a.A.Equal(landedAddr):
		return "landed"
	}
	return "old"
}

// outcomesOnceCounted is outcomes, read once it reaches want or 5 s have
// passed: the client-response timer counts each answer on its own
// goroutine after writing it, so a client may have its answer a moment
// before the counter moves.
func outcomesOnceCounted(p *proxy, outcome string, want int) int {
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := outcomes(p, "A", outcome)
		if got == want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(time.Millisecond)
	}
}

// wantSettled fails unless nothing is left in flight or in the tables and
// every client in ws had exactly one answer.
func (r *lateRig) wantSettled(t *testing.T, ws ...*lateWriter) {
	t.Helper()
	r.wantInflight(t, "with every answer given", 0)
	if got := flightsOut(r.p); got != 0 {
		t.Fatalf("%d flights left in the tables", got)
	}
	for _, w := range ws {
		if n := w.writes(); n != 1 {
			t.Fatalf("client %d: %d answers, want 1", w.id, n)
		}
	}
}

// A query that comes while a flight lands whose answer the cache does not
// take (no cache, SERVFAIL, REFUSED, TTL 0, TC, no reply at all) finds
// the flight still in the table and joins it: the landing, which reads
// its waiters only once the flight has left the table, answers it, once,
// with the flight's own outcome. The upstream is asked once.
func TestQueryJoiningAFlightAsItLandsIsAnsweredOnce(t *testing.T) {
	upErr := errors.New("test: the upstream is unreachable")
	tests := []struct {
		name    string
		cache   bool
		network string
		reply   func(req *dns.Msg) []byte // nil: upErr
		want    string                    // kind of both answers
		outcome string
	}{
		{name: "no cache, udp", network: "udp", reply: landed(nil), want: "landed", outcome: "forwarded"},
		{name: "no cache, tcp", network: "tcp", reply: landed(nil), want: "landed", outcome: "forwarded"},
		{name: "SERVFAIL is not stored", cache: true, network: "udp", reply: landed(withRcode(dns.RcodeServerFailure)), want: "SERVFAIL", outcome: "forwarded"},
		{name: "REFUSED is not stored", cache: true, network: "tcp", reply: landed(withRcode(dns.RcodeRefused)), want: "REFUSED", outcome: "forwarded"},
		{name: "TTL 0 is not stored", cache: true, network: "udp", reply: landed(func(m *dns.Msg) { m.Answer[0].Header().Ttl = 0 }), want: "landed", outcome: "forwarded"},
		{name: "TC is not stored", cache: true, network: "udp", reply: landed(func(m *dns.Msg) { m.Truncated, m.Answer = true, nil }), want: "tc", outcome: "forwarded"},
		{name: "no reply", cache: true, network: "udp", want: "SERVFAIL", outcome: "upstream_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newLateRig(t, lateRigConfig{cache: tt.cache})
			var late *lateWriter
			ran := r.duringLanding(t, func() {
				late = r.send(t, tt.network, "land.example", 2)
				if !returnedNow(t, "the query inside the landing", late) {
					return
				}
				if n := late.writes(); n != 0 {
					t.Errorf("the query inside the landing had %d answers before the landing read its waiters, want 0: it did not join", n)
				}
				if got := r.coalesced(); got != 1 {
					t.Errorf("coalesced %d inside the landing, want 1", got)
				}
				if got := r.sent(); got != 1 {
					t.Errorf("the upstream got %d queries by the time the query inside the landing was handled, want 1", got)
				}
			})
			first := r.send(t, tt.network, "land.example", 1)
			within(t, "the first query's handler", first.returned)
			r.ups[0].endWith(tt.reply, upErr)
			if !ran.Load() {
				t.Fatal("the landing hook did not run")
			}
			if t.Failed() {
				t.FailNow()
			}
			for _, w := range []*lateWriter{first, late} {
				if got := kind(w.answered(t, fmt.Sprintf("client %d", w.id))); got != tt.want {
					t.Fatalf("client %d: %s, want %s", w.id, got, tt.want)
				}
			}
			if got := outcomes(r.p, "A", tt.outcome); got != 2 {
				t.Fatalf("outcome %s counted %d times, want 2", tt.outcome, got)
			}
			if got := r.sent(); got != 1 {
				t.Fatalf("the upstream got %d queries, want 1", got)
			}
			r.wantSettled(t, first, late)
		})
	}
}

// Queries that come while a flight lands with an answer the cache takes,
// or while a refresh lands that failed, are answered from the cache at
// once — fresh from the landed answer, stale while the name waits out its
// recheck, fresh from the old entry when a prefetch failed — over either
// network, however many: none joins the flight and none goes upstream.
// The landing answers its own clients only, once each, even those its
// client-response timer answered before it landed.
func TestQueryWhileAFlightLandsIsAnsweredFromTheCache(t *testing.T) {
	const name = "www.example.com"
	expired, prefetchAt := tc0.Add(61*time.Second), tc0.Add(55*time.Second)
	stored := landed(nil)
	servfail := landed(withRcode(dns.RcodeServerFailure))
	upErr := errors.New("test: the upstream is unreachable")
	tests := []struct {
		name      string
		prime     bool          // the name cached at tc0 first
		at        time.Time     // when the first query comes (zero: tc0)
		staleWait time.Duration // the client-response timer
		timerLast bool          // wait for the first client's answer from its timer before the upstream answers
		network   string        // the first query's
		udp, tcp  int           // queries sent inside the landing
		reply     func(req *dns.Msg) []byte
		wantFirst string // "" : a prefetch, answered from the cache before
		wantLate  string
		wantOut   map[string]int // outcomes counted, all told (the priming query's forwarded one aside)
	}{
		{name: "miss, udp, a udp query", network: "udp", udp: 1, reply: stored,
			wantFirst: "landed", wantLate: "landed", wantOut: map[string]int{"forwarded": 1, "cached": 1}},
		{name: "miss, udp, a tcp query", network: "udp", tcp: 1, reply: stored,
			wantFirst: "landed", wantLate: "landed", wantOut: map[string]int{"forwarded": 1, "cached": 1}},
		{name: "miss, tcp, a udp query", network: "tcp", udp: 1, reply: stored,
			wantFirst: "landed", wantLate: "landed", wantOut: map[string]int{"forwarded": 1, "cached": 1}},
		{name: "miss, udp, a crowd over both", network: "udp", udp: 2 * maxFollowers, tcp: maxFollowers, reply: stored,
			wantFirst: "landed", wantLate: "landed", wantOut: map[string]int{"forwarded": 1, "cached": 3 * maxFollowers}},
		{name: "expired, refreshed", prime: true, at: expired, network: "udp", udp: 3, tcp: 1, reply: stored,
			wantFirst: "landed", wantLate: "landed", wantOut: map[string]int{"forwarded": 1, "cached": 4}},
		{name: "expired, SERVFAIL: stale at once", prime: true, at: expired, network: "udp", udp: 3, tcp: 1, reply: servfail,
			wantFirst: "stale", wantLate: "stale", wantOut: map[string]int{"stale": 5}},
		{name: "expired, no reply: stale at once", prime: true, at: expired, network: "tcp", udp: 1, tcp: 3,
			wantFirst: "stale", wantLate: "stale", wantOut: map[string]int{"stale": 5}},
		{name: "expired, its timer fired, refreshed", prime: true, at: expired, staleWait: 5 * time.Millisecond, timerLast: true, network: "udp", udp: 2, tcp: 1, reply: stored,
			wantFirst: "stale", wantLate: "landed", wantOut: map[string]int{"stale": 1, "cached": 3}},
		{name: "expired, its timer fired, SERVFAIL", prime: true, at: expired, staleWait: 5 * time.Millisecond, timerLast: true, network: "udp", udp: 2, tcp: 1, reply: servfail,
			wantFirst: "stale", wantLate: "stale", wantOut: map[string]int{"stale": 4}},
		{name: "prefetch, refreshed", prime: true, at: prefetchAt, network: "udp", udp: 2, tcp: 1, reply: stored,
			wantLate: "landed", wantOut: map[string]int{"cached": 4}},
		{name: "prefetch, SERVFAIL: the old entry", prime: true, at: prefetchAt, network: "udp", udp: 2, tcp: 1, reply: servfail,
			wantLate: "old", wantOut: map[string]int{"cached": 4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newLateRig(t, lateRigConfig{cache: true, staleWait: tt.staleWait})
			if tt.prime {
				r.prime(t, name)
			}
			primed := r.sent()
			var lates []*lateWriter
			ran := r.duringLanding(t, func() {
				for i := range tt.udp + tt.tcp {
					network := "udp"
					if i >= tt.udp {
						network = "tcp"
					}
					lates = append(lates, r.send(t, network, name, uint16(100+i)))
				}
				for _, w := range lates {
					if !returnedNow(t, "a query inside the landing", w) {
						return
					}
					if n := w.writes(); n != 1 {
						t.Errorf("client %d inside the landing: %d answers by the time its handler returned, want 1 (from the cache)", w.id, n)
						return
					}
				}
				if got := r.coalesced(); got != 0 {
					t.Errorf("coalesced %d inside the landing, want 0", got)
				}
				if got := r.sent() - primed; got != 1 {
					t.Errorf("the upstream got %d queries by the time the queries inside the landing were handled, want 1", got)
				}
			})
			if !tt.at.IsZero() {
				r.clock.set(tt.at)
			}
			first := r.send(t, tt.network, name, 1)
			within(t, "the first query's handler", first.returned)
			if tt.wantFirst == "" {
				within(t, "the prefetch's client, answered from the cache", first.done)
			}
			if tt.timerLast {
				within(t, "the first query's client-response timer", first.done)
			}
			if got := r.sent() - primed; got != 1 {
				t.Fatalf("the upstream got %d queries, want 1", got)
			}
			r.ups[0].endWith(tt.reply, upErr)
			if !ran.Load() {
				t.Fatal("the landing hook did not run")
			}
			if t.Failed() {
				t.FailNow()
			}
			for _, w := range lates {
				if got := kind(w.answered(t, "a query inside the landing")); got != tt.wantLate {
					t.Fatalf("client %d inside the landing (%s): %s, want %s", w.id, w.network, got, tt.wantLate)
				}
			}
			want := tt.wantFirst
			if want == "" {
				want = "old"
			}
			if got := kind(first.answered(t, "the first query")); got != want {
				t.Fatalf("the first query: %s, want %s", got, want)
			}
			for _, o := range []string{"forwarded", "cached", "stale", "upstream_error"} {
				want := tt.wantOut[o]
				if tt.prime && o == "forwarded" {
					want++ // the priming query
				}
				got := outcomesOnceCounted(r.p, o, want)
				if tt.prime && o == "forwarded" {
					got--
				}
				if got != tt.wantOut[o] {
					t.Fatalf("outcome %s counted %d times, want %d", o, got, tt.wantOut[o])
				}
			}
			if got := r.sent() - primed; got != 1 {
				t.Fatalf("the upstream got %d queries, want 1", got)
			}
			r.wantSettled(t, append(lates, first)...)
		})
	}
}

// The client-response timer of an expired entry's refresh fires inside
// the landing of an answer the cache does not take (TC), so the entry is
// still expired and a query inside the landing may still join. The timer
// and the landing race for the waiters; whichever way the query and the
// timer fall, every client is answered once, stale, by the timer or at
// once, and the landing writes nothing and still recycles the flight.
func TestTimerFiringInsideALandingAnswersEachClientOnce(t *testing.T) {
	const name = "www.example.com"
	const staleWait = 400 * time.Millisecond // on the manual clock
	truncated := landed(func(m *dns.Msg) { m.Truncated, m.Answer = true, nil })
	tests := []struct {
		name          string
		joinFirst     bool // the query joins, then the timer fires; else the other way round
		wantCoalesced int
	}{
		{name: "the query joins, then the timer fires", joinFirst: true, wantCoalesced: 1},
		{name: "the timer fires, then the query comes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newLateRig(t, lateRigConfig{cache: true, staleWait: staleWait})
			clock := guard.NewManualClock(tc0)
			r.p.cache.clock, r.p.clock = clock, clock // timers the test fires
			r.prime(t, name)
			primed := r.sent()
			clock.Set(tc0.Add(61 * time.Second))
			first := r.send(t, "udp", name, 1)
			within(t, "the first query's handler", first.returned)
			var late *lateWriter
			ran := r.duringLanding(t, func() {
				if tt.joinFirst {
					late = r.send(t, "udp", name, 2)
					if !returnedNow(t, "the query inside the landing", late) {
						return
					}
					if n := late.writes(); n != 0 {
						t.Errorf("the query inside the landing had %d answers before the timer fired, want 0: it did not join", n)
						return
					}
				}
				clock.Advance(staleWait)
				if !doneNow(t, "the first query (its timer)", first) {
					return
				}
				if !tt.joinFirst {
					late = r.send(t, "udp", name, 2)
					if !returnedNow(t, "the query inside the landing", late) {
						return
					}
				}
				doneNow(t, "the query inside the landing", late)
			})
			r.ups[0].endWith(truncated, nil)
			if !ran.Load() {
				t.Fatal("the landing hook did not run")
			}
			if t.Failed() {
				t.FailNow()
			}
			for _, w := range []*lateWriter{first, late} {
				if got := kind(w.answered(t, "a client")); got != "stale" {
					t.Fatalf("client %d: %s, want stale", w.id, got)
				}
			}
			if got := r.coalesced(); got != tt.wantCoalesced {
				t.Fatalf("coalesced %d, want %d", got, tt.wantCoalesced)
			}
			if got := outcomesOnceCounted(r.p, "stale", 2); got != 2 {
				t.Fatalf("stale counted %d times, want 2", got)
			}
			if got := outcomes(r.p, "A", "forwarded"); got != 1 { // the priming query
				t.Fatalf("forwarded counted %d times, want 1 (the priming query's)", got)
			}
			if got := r.sent() - primed; got != 1 {
				t.Fatalf("the upstream got %d queries, want 1", got)
			}
			r.wantSettled(t, first, late)
		})
	}
}

// A crowd of identical queries over both networks comes while a flight
// with followers lands and nothing is cached: the UDP ones fill the
// landing flight to maxFollowers, and those beyond share one flight
// beside it; the TCP ones share one flight of their own. Three upstream
// queries in all, each client answered once, every query but those three
// counted coalesced, every one forwarded, and nothing in flight after.
func TestCrowdWhileAFlightLandsFillsItThenSharesOneBeside(t *testing.T) {
	const before = 10             // followers joined before the landing
	const udp = maxFollowers + 20 // UDP queries inside it: maxFollowers-before join, 30 beside
	const tcp = 40
	r := newLateRig(t, lateRigConfig{})
	first := r.send(t, "udp", "crowd.example", 1)
	within(t, "the first query's handler", first.returned)
	all := []*lateWriter{first}
	for i := range before {
		w := r.send(t, "udp", "crowd.example", uint16(10+i))
		within(t, "a follower's handler", w.returned)
		all = append(all, w)
	}
	var lates []*lateWriter
	ran := r.duringLanding(t, func() {
		for i := range udp + tcp { // all at once
			network := "udp"
			if i >= udp {
				network = "tcp"
			}
			lates = append(lates, r.send(t, network, "crowd.example", uint16(100+i)))
		}
		for _, w := range lates {
			if !returnedNow(t, "a query inside the landing", w) {
				return
			}
		}
		if got := r.sent(); got != 3 {
			t.Errorf("the upstream got %d queries inside the landing, want 3: the landing one, one UDP and one TCP beside it", got)
		}
		if got := r.p.inflight.Load(); got != 2 {
			t.Errorf("%d in flight inside the landing, want 2 (the landing one has left the cap)", got)
		}
		for _, w := range lates {
			if n := w.writes(); n != 0 {
				t.Errorf("client %d answered inside the landing, before any flight's waiters were read", w.id)
				return
			}
		}
	})
	r.ups[0].endWith(landed(nil), nil) // the landing; its hook sends the crowd
	if !ran.Load() {
		t.Fatal("the landing hook did not run")
	}
	if t.Failed() {
		t.FailNow()
	}
	r.ups[0].endWith(landed(nil), nil) // the two flights beside it
	all = append(all, lates...)
	for _, w := range all {
		if got := kind(w.answered(t, "a client")); got != "landed" {
			t.Fatalf("client %d (%s): %s, want landed", w.id, w.network, got)
		}
	}
	total := 1 + before + udp + tcp
	if got := r.coalesced(); got != total-3 {
		t.Fatalf("coalesced %d, want %d", got, total-3)
	}
	if got := outcomes(r.p, "A", "forwarded"); got != total {
		t.Fatalf("forwarded %d, want %d", got, total)
	}
	if got := testutil.ToFloat64(r.p.metrics.InFlight); got != 0 {
		t.Fatalf("in-flight gauge %v, want 0", got)
	}
	if got := r.sent(); got != 3 {
		t.Fatalf("the upstream got %d queries, want 3", got)
	}
	r.wantSettled(t, all...)
}

// A TCP query that comes while a UDP flight lands with a truncated answer
// (which the cache does not take) must not get it: it joins nothing across
// networks and asks the upstream over TCP itself, while a UDP query that
// comes with it joins the landing and gets the TC answer it can retry.
func TestTCPQueryWhileATruncatedUDPAnswerLandsAsksOverTCP(t *testing.T) {
	r := newLateRig(t, lateRigConfig{cache: true})
	first := r.send(t, "udp", "tc.example", 1)
	within(t, "the first query's handler", first.returned)
	var overTCP, overUDP *lateWriter
	ran := r.duringLanding(t, func() {
		overTCP = r.send(t, "tcp", "tc.example", 2)
		overUDP = r.send(t, "udp", "tc.example", 3)
		if !returnedNow(t, "the TCP query", overTCP) || !returnedNow(t, "the UDP query", overUDP) {
			return
		}
		if got := r.coalesced(); got != 1 {
			t.Errorf("coalesced %d inside the landing, want 1 (the UDP query)", got)
		}
		r.ups[0].mu.Lock()
		nets := append([]string(nil), r.ups[0].nets...)
		r.ups[0].mu.Unlock()
		if len(nets) != 2 || nets[0] != "udp" || nets[1] != "tcp" {
			t.Errorf("the upstream was asked over %v inside the landing, want [udp tcp]", nets)
		}
	})
	r.ups[0].endWith(landed(func(m *dns.Msg) { m.Truncated, m.Answer = true, nil }), nil)
	if !ran.Load() {
		t.Fatal("the landing hook did not run")
	}
	if t.Failed() {
		t.FailNow()
	}
	for _, w := range []*lateWriter{first, overUDP} {
		if got := kind(w.answered(t, "a UDP client")); got != "tc" {
			t.Fatalf("UDP client %d: %s, want tc", w.id, got)
		}
	}
	if overTCP.writes() != 0 {
		t.Fatal("the TCP query was answered before its own flight landed")
	}
	r.ups[0].endWith(landed(nil), nil) // the TCP flight
	if got := kind(overTCP.answered(t, "the TCP client")); got != "landed" {
		t.Fatalf("the TCP client: %s, want landed", got)
	}
	if got := outcomes(r.p, "A", "forwarded"); got != 3 {
		t.Fatalf("forwarded %d, want 3", got)
	}
	r.wantSettled(t, first, overUDP, overTCP)
}
