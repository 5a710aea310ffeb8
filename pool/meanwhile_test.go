package pool

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
)

// hookedLimit is an outbound limit that gives every token asked, or
// refuses every one after the first, and runs meanwhile while the second
// is asked: the moment an extra attempt is being set up.
type hookedLimit struct {
	refuseSecond bool
	meanwhile    func()
	asked        atomic.Int64
}

func (l *hookedLimit) Allow(int) bool {
	if l.asked.Add(1) != 2 {
		return true
	}
	l.meanwhile()
	return !l.refuseSecond
}

// The first attempt ends while the hedge is being set up: after the hedge
// took the second upstream's half-open probe and its budget, before it is
// sent. Whatever it brings, the query is reported once; an answer sends
// no hedge, and the probe's place is given back, so the second upstream's
// next query probes; a failure leaves the query to the hedge, or, if the
// hedge is refused its token, reports the failure at once. The Exchange is
// reused cleanly after each.
func TestFirstAttemptEndsWhileTheHedgeIsSetUp(t *testing.T) {
	tests := []struct {
		name         string
		first        outcome // how the first attempt ends, meanwhile
		refuseSecond bool    // the hedge's token
		wantHedge    bool    // the hedge reaches the second upstream
		wantRcode    int     // -1: an error
	}{
		{"answered, the hedge not sent", good, false, false, dns.RcodeSuccess},
		{"answered, the hedge refused anyway", good, true, false, dns.RcodeSuccess},
		{"failed, the hedge answers", netErr, false, true, dns.RcodeSuccess},
		{"failed, the hedge refused", netErr, true, false, -1},
		{"servfail, the hedge refused", servfail, true, false, dns.RcodeServerFailure},
		{"shutdown, the hedge answers", closed, false, true, dns.RcodeSuccess},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			limit := &hookedLimit{refuseSecond: tt.refuseSecond}
			r := newRig(t, rigConfig{n: 2, breakers: true, budget: generous, hedge: 100 * time.Millisecond, outbound: limit})
			limit.meanwhile = func() {
				if b := r.pool.Breaker(1); b.State() != guard.HalfOpen {
					t.Errorf("while the hedge is set up, upstream 1's breaker is %v: the hedge should hold its probe", b.State())
				}
				held := r.ups[0].takeHeld()
				if len(held) != 1 {
					t.Errorf("%d first attempts held, want 1", len(held))
					return
				}
				finish(held[0], tt.first)
			}
			r.setState(t, 1, readyB) // the hedge takes its probe
			r.ups[1].decide = func([]byte) outcome { return good }
			ch, err := r.ask("meanwhile.example")
			if err != nil {
				t.Fatal(err)
			}
			hedgerWaits(t, r)
			r.clock.Advance(100 * time.Millisecond)
			res := wait(t, ch)
			if got := rcode(res); got != tt.wantRcode {
				t.Fatalf("rcode %d (%v), want %d", got, res.err, tt.wantRcode)
			}
			none(t, ch, "after the report")
			if limit.asked.Load() != 2 {
				t.Fatalf("%d tokens asked, want 2: the first attempt's and the hedge's", limit.asked.Load())
			}
			if n := r.ups[1].count(); (n == 1) != tt.wantHedge || n > 1 {
				t.Fatalf("%d attempts at upstream 1, want the hedge sent %v", n, tt.wantHedge)
			}
			b := r.pool.Breaker(1)
			if tt.wantHedge {
				if s := b.State(); s != guard.Closed {
					t.Fatalf("the hedge, upstream 1's probe, was answered; its breaker is %v, want closed", s)
				}
			} else {
				waitProbeFree(t, b, "the unsent hedge to give upstream 1's probe back")
			}

			r.nextQueryReusesExchange(t, ch) // the Exchange is back in the pool
		})
	}
}
