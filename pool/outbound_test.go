package pool

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// tokens is an outbound limit holding a fixed number of tokens, never
// refilled; it counts the tokens asked for and those it gave.
type tokens struct {
	left, asked, given atomic.Int64
}

func holding(n int64) *tokens {
	b := &tokens{}
	b.left.Store(n)
	return b
}

func (b *tokens) Allow(n int) bool {
	b.asked.Add(int64(n))
	if b.left.Add(-int64(n)) < 0 {
		b.left.Add(int64(n))
		return false
	}
	b.given.Add(int64(n))
	return true
}

// sends counts the attempts every upstream of r was given.
func (r *rig) sends() int64 {
	var n int64
	for _, up := range r.ups {
		n += int64(up.count())
	}
	return n
}

// A first attempt the outbound limit refuses is no attempt: Acquire says
// ErrLimited, nothing is sent, and the breaker's permit is given back
// without a sample, so a half-open breaker's probe is still there for the
// next query the limit lets through.
func TestOutboundRefusesFirstAttempt(t *testing.T) {
	out := holding(0)
	r := newRig(t, rigConfig{n: 1, breakers: true, outbound: out})
	r.setState(t, 0, readyB) // the next Acquire takes the probe
	if _, err := r.ask("limited.example"); !errors.Is(err, ErrLimited) {
		t.Fatalf("Acquire with no token: %v, want ErrLimited", err)
	}
	if n := r.sends(); n != 0 || out.asked.Load() != 1 {
		t.Fatalf("%d attempts sent, %d tokens asked; want 0 and 1", n, out.asked.Load())
	}
	out.left.Store(1)
	ch, err := r.ask("probe.example")
	if err != nil {
		t.Fatalf("the probe's place was not given back: %v", err)
	}
	finish(r.ups[0].takeHeld()[0], good)
	if res := wait(t, ch); rcode(res) != dns.RcodeSuccess {
		t.Fatalf("the probe: rcode %d (%v)", rcode(res), res.err)
	}
}

// Every attempt sent pays one token — the first, a retry, a hedge — and an
// extra attempt the limit refuses is simply not sent: the query ends with
// what its first attempt brought, and the refused attempt's breaker permit
// is given back (a half-open second upstream keeps its probe).
func TestOutboundPaysEveryAttempt(t *testing.T) {
	tests := []struct {
		name      string
		tokens    int64
		first     outcome // hold: the hedge's case
		hedge     bool
		wantSends [2]int
		wantRcode int
	}{
		{"retry paid", 2, servfail, false, [2]int{1, 1}, dns.RcodeSuccess},
		{"retry refused", 1, servfail, false, [2]int{1, 0}, dns.RcodeServerFailure},
		{"hedge paid", 2, hold, true, [2]int{1, 1}, dns.RcodeSuccess},
		{"hedge refused", 1, hold, true, [2]int{1, 0}, dns.RcodeSuccess},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := holding(tt.tokens)
			rc := rigConfig{n: 2, breakers: true, budget: generous, outbound: out}
			if tt.hedge {
				rc.hedge = 100 * time.Millisecond
			}
			r := newRig(t, rc)
			r.setState(t, 1, readyB) // the extra attempt would be its probe
			r.ups[0].decide = func([]byte) outcome { return tt.first }
			r.ups[1].decide = func([]byte) outcome { return good }
			ch, err := r.ask("www.example")
			if err != nil {
				t.Fatal(err)
			}
			if tt.hedge {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := r.clock.BlockUntilWaiters(ctx, 1); err != nil {
					t.Fatal("the hedger never waited for the hedge:", err)
				}
				r.clock.Advance(100 * time.Millisecond)
				waitUntil(t, "the hedge to ask for its token", func() bool { return out.asked.Load() == 2 })
				if tt.wantSends[1] == 0 {
					finish(r.ups[0].takeHeld()[0], good) // the first attempt answers after all
				}
			}
			res := wait(t, ch)
			none(t, ch, "after the report")
			if got := rcode(res); got != tt.wantRcode {
				t.Fatalf("rcode %d (%v), want %d", got, res.err, tt.wantRcode)
			}
			if n0, n1 := r.ups[0].count(), r.ups[1].count(); n0 != tt.wantSends[0] || n1 != tt.wantSends[1] {
				t.Fatalf("attempts %d and %d, want %v", n0, n1, tt.wantSends)
			}
			if sent, paid := r.sends(), out.given.Load(); sent != paid || out.asked.Load() != 2 {
				t.Fatalf("%d attempts sent, %d tokens paid, %d asked: want every attempt paid, two asked", sent, paid, out.asked.Load())
			}
			if retries := r.obs.retries[RetryAnswer].Load() + r.obs.retries[RetryHedge].Load(); retries != int64(tt.wantSends[1]) {
				t.Fatalf("the observer heard of %d extra attempts, want %d", retries, tt.wantSends[1])
			}
			if tt.wantSends[1] == 0 {
				waitProbeFree(t, r.pool.Breaker(1), "the refused attempt to give upstream 1's probe back")
			}
		})
	}
}
