package main

import (
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dnsproxi/exercises/fakeupstream"
)

// DNS_CACHE_STALE is the maximum stale timer (RFC 8767 §5): an answer is
// never served stale once its entry is past expiry + the window, even when
// the entry was inside the window when its query looked it up. Past the
// window the client gets what it would get without the entry: the
// refresh's own outcome, or the refusal's.

// wantNotStale fails if r is a stale answer (EDE 3 or 19, or a TTL of 30
// on an answer the upstream gave TTL 60) or lacks the rcode wanted.
func wantNotStale(t *testing.T, what string, r *dns.Msg, rcode int) {
	t.Helper()
	if r == nil {
		t.Fatalf("%s: no answer", what)
	}
	for _, code := range edeCodes(r) {
		if code == dns.ExtendedErrorCodeStaleAnswer || code == dns.ExtendedErrorCodeStaleNXDOMAINAnswer {
			t.Fatalf("%s: a stale answer (EDE %v, %s %v) past the stale window", what, edeCodes(r), rcodeName(r), ttls(r))
		}
	}
	if r.Rcode != rcode {
		t.Fatalf("%s: %s %v, want %s", what, rcodeName(r), ttls(r), dns.RcodeToString[rcode])
	}
	for _, ttl := range ttls(r) {
		if ttl == 30 {
			t.Fatalf("%s: TTLs %v, the stale TTL", what, ttls(r))
		}
	}
}

// expireToWindowEnd stores www.example.com (TTL 60) and moves the clock to
// 1 s before its stale window (window) ends.
func expireToWindowEnd(t *testing.T, a *app, clock interface{ Advance(time.Duration) }, window time.Duration) {
	t.Helper()
	if r := askEDNS(t, a, "www.example.com"); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("priming: %s %s", rcodeName(r), answerText(r))
	}
	clock.Advance(60*time.Second + window - time.Second)
}

// The client-response timer fires 0.8 s after the window ended: it must
// not answer stale. The client waits for the refresh, as without the
// entry, and gets what it brings: the new answer, or the upstream's
// SERVFAIL. (Before, the timer answered stale 0.8 s past the window.)
func TestStaleWaitTimerPastTheWindowAnswersNothingStale(t *testing.T) {
	for _, tt := range []struct {
		name  string
		rcode int
	}{{"the refresh answers", dns.RcodeSuccess}, {"the refresh is SERVFAIL", dns.RcodeServerFailure}} {
		t.Run(tt.name, func(t *testing.T) {
			a, up, clock := startCaching(t, func(c *Config) {
				c.CacheStale = 10 * time.Minute
				c.UpstreamTimeout = 5 * time.Second
				c.CacheStaleWait = 1800 * time.Millisecond
			})
			expireToWindowEnd(t, a, clock, 10*time.Minute)
			gate, open := holdGate(t)
			up.SetScript(func(req *dns.Msg, _ string) [][]byte {
				<-gate
				m := fakeupstream.Answer(req)
				if tt.rcode != dns.RcodeSuccess {
					m = new(dns.Msg).SetRcode(req, tt.rcode)
				} else {
					m.Answer[0].(*dns.A).A = net.IPv4(192, 0, 2, 99)
				}
				b, _ := m.Pack()
				return [][]byte{b}
			})
			got := askWhileStaleWaits(t, a, clock) // 1 s of the window left at the lookup
			clock.Advance(1800 * time.Millisecond) // the timer: 0.8 s past the window
			open()
			r := answerWithin5s(t, "the client", got)
			wantNotStale(t, "timer past the window", r, tt.rcode)
			if tt.rcode == dns.RcodeSuccess && (len(r.Answer) != 1 || !r.Answer[0].(*dns.A).A.Equal(net.IPv4(192, 0, 2, 99))) {
				t.Errorf("answer %s, want the refresh's new address", answerText(r))
			}
			if got := count(a, "A", "stale", 0); got != 0 {
				t.Errorf("stale %d, want 0", got)
			}
		})
	}
}

// The refresh fails 1 s after the window ended (no client-response timer):
// the client gets the failure's outcome, not the stale answer. Before, the
// failure's stale answer was served however long the refresh had taken.
func TestFailedRefreshPastTheWindowAnswersNothingStale(t *testing.T) {
	for _, tt := range []struct {
		name  string
		reply bool // SERVFAIL; else no reply: the upstream timeout (500 ms, real)
		rcode int
		ede   uint16
	}{
		{"SERVFAIL", true, dns.RcodeServerFailure, 0},
		{"no reply", false, dns.RcodeServerFailure, dns.ExtendedErrorCodeNoReachableAuthority},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, up, clock := startCaching(t, func(c *Config) { c.CacheStale = 10 * time.Minute })
			expireToWindowEnd(t, a, clock, 10*time.Minute)
			gate, open := holdGate(t)
			var calls atomic.Int64
			up.SetScript(func(req *dns.Msg, _ string) [][]byte {
				calls.Add(1)
				<-gate
				if !tt.reply {
					return nil
				}
				b, _ := new(dns.Msg).SetRcode(req, dns.RcodeServerFailure).Pack()
				return [][]byte{b}
			})
			got := make(chan *dns.Msg, 1)
			go func() {
				q := query("www.example.com", dns.TypeA)
				q.SetEdns0(1232, false)
				r, _ := tryAsk("udp", a.addr(), q, 5*time.Second)
				got <- r
			}()
			waitFor(t, "the refresh to reach the upstream", func() bool { return calls.Load() >= 1 })
			clock.Advance(2 * time.Second) // 1 s past the window
			open()
			r := answerWithin5s(t, "the client", got)
			wantNotStale(t, "refresh failed past the window", r, tt.rcode)
			if codes := edeCodes(r); tt.ede != 0 && (len(codes) != 1 || codes[0] != tt.ede) {
				t.Errorf("EDE %v, want [%d]", codes, tt.ede)
			}
			if got := count(a, "A", "stale", 0); got != 0 {
				t.Errorf("stale %d, want 0", got)
			}
		})
	}
}

// A refresh refused after the window ended while it was inside the pool's
// Acquire (its lookup was inside the window; here the outbound limit holds
// it there) gets the refusal's answer, REFUSED, not the stale one.
func TestRefusedRefreshPastTheWindowAnswersNothingStale(t *testing.T) {
	r := newLateRig(t, lateRigConfig{cache: true})
	r.prime(t, "www.example.com")
	r.clock.set(tc0.Add(60*time.Second + time.Hour - time.Second)) // 1 s of the window left
	r.out.arm(t)
	w := r.send(t, "udp", "www.example.com", 2)
	release := r.out.waitPaused(t) // looked up inside the window, now in Acquire
	r.out.refuse.Store(true)
	r.clock.set(tc0.Add(60*time.Second + time.Hour + time.Second))
	release()
	wantNotStale(t, "refused past the window", w.answered(t, "the refused refresh"), dns.RcodeRefused)
}

// A query that finds, at step 5, the refresh of its name already answered
// stale by its timer gets the stale answer at once: but not once the
// window has ended while it was inside Acquire. It then asks the upstream
// as a query for a name not cached, and gets what the upstream says.
func TestLateJoinPastTheWindowAnswersNothingStale(t *testing.T) {
	r := newLateRig(t, lateRigConfig{cache: true, staleWait: time.Millisecond})
	r.prime(t, "www.example.com")
	r.clock.set(tc0.Add(60*time.Second + time.Hour - time.Second)) // 1 s of the window left
	r.out.arm(t)
	late := r.send(t, "udp", "www.example.com", 2)
	release := r.out.waitPaused(t) // looked up inside the window, now in Acquire
	first := r.send(t, "udp", "www.example.com", 3)
	wantStale(t, first.answered(t, "the refresh answered by its timer")) // inside the window: stale, rightly
	r.clock.set(tc0.Add(60*time.Second + time.Hour + time.Second))
	release()
	waitFor(t, "the late query to be answered or sent", func() bool { return late.writes() > 0 || r.sent() == 3 })
	if late.writes() > 0 {
		wantNotStale(t, "late join past the window", late.answered(t, "the late query"), dns.RcodeServerFailure)
	}
	r.ups[0].end(dns.RcodeServerFailure) // both refreshes fail
	wantNotStale(t, "late join past the window", late.answered(t, "the late query"), dns.RcodeServerFailure)
}

// The sharpest case: a client whose own lookup found nothing (the window
// had ended) joins the refresh of the name that another client started
// inside the window, and the refresh's client-response timer fires after
// that. Before, the timer answered both stale: one client got a stale
// answer for a name its lookup had found no entry for. Now both get what
// the refresh brings.
func TestJoinerPastTheWindowGetsNoStaleFromTheTimer(t *testing.T) {
	a, up, clock := startCaching(t, func(c *Config) {
		c.CacheStale = 10 * time.Minute
		c.UpstreamTimeout = 5 * time.Second
		c.CacheStaleWait = 1800 * time.Millisecond
	})
	expireToWindowEnd(t, a, clock, 10*time.Minute)
	gate, open := holdGate(t)
	up.SetScript(func(req *dns.Msg, _ string) [][]byte {
		<-gate
		b, _ := new(dns.Msg).SetRcode(req, dns.RcodeServerFailure).Pack()
		return [][]byte{b}
	})
	first := askWhileStaleWaits(t, a, clock) // 1 s of the window left at its lookup
	clock.Advance(1500 * time.Millisecond)   // 0.5 s past the window; the timer is due in 0.3 s
	late := make(chan *dns.Msg, 1)
	go func() {
		q := query("www.example.com", dns.TypeA)
		q.SetEdns0(1232, false)
		r, _ := tryAsk("udp", a.addr(), q, 5*time.Second)
		late <- r
	}()
	waitFor(t, "the late client to join the refresh", func() bool { return testutil.ToFloat64(a.metrics.Coalesced) == 1 })
	clock.Advance(300 * time.Millisecond) // the timer fires
	open()
	for _, c := range []struct {
		what string
		ch   <-chan *dns.Msg
	}{{"the late client", late}, {"the first client", first}} {
		wantNotStale(t, c.what, answerWithin5s(t, c.what, c.ch), dns.RcodeServerFailure)
	}
	if got := count(a, "A", "stale", 0); got != 0 {
		t.Errorf("stale %d, want 0", got)
	}
}
