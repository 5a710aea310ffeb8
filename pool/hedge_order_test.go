package pool

import (
	"context"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// forwardAtOn acquires and forwards a query with the caller's reading now,
// as handleQuery does with the reading it took when the query came in.
func forwardAtOn(t *testing.T, r *rig, name string, now time.Time) {
	t.Helper()
	x, err := r.pool.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	b, _ := m.Pack()
	x.ForwardAt(now, b, "udp", func(time.Time, []byte, []byte, error) {})
}

// A hedge comes due its delay after the reading its query was forwarded
// with, whatever the order in which queries reach the pool: a query whose
// caller read the clock earlier but reached the pool later (preempted, or
// answering a prefetched name first) must not wait behind one read later.
// (The queue was kept in the order hedges were added, and only its head was
// looked at: this hedge went out 40 ms late, with the later query's.)
func TestHedgeOfAnEarlierReadingIsNotLate(t *testing.T) {
	r := newRig(t, rigConfig{n: 2, budget: generous, hedge: 50 * time.Millisecond})
	forwardAtOn(t, r, "later.example", t0)                             // hedge due t0+50ms
	forwardAtOn(t, r, "earlier.example", t0.Add(-40*time.Millisecond)) // read 40ms before, added after: due t0+10ms
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.clock.BlockUntilWaiters(ctx, 1); err != nil {
		t.Fatal("the hedger never waited:", err)
	}
	// The clock moves on a millisecond at a time from t0+10ms, when the
	// earlier query's hedge is due, and the hedge must go out before the
	// later query's comes due at t0+50ms. (A step taken while the hedger
	// sets its alarm may make it ring a step late: hence steps, not one
	// jump to t0+10ms.)
	r.clock.Advance(9 * time.Millisecond)
	for step := 10; step < 50; step++ {
		r.clock.Advance(time.Millisecond)
		deadline := time.Now().Add(20 * time.Millisecond)
		for r.obs.retries[RetryHedge].Load() == 0 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Microsecond)
		}
		if h := r.obs.retries[RetryHedge].Load(); h != 0 {
			if h != 1 || step > 15 {
				t.Fatalf("at t0+%dms %d hedges sent, want the earlier query's alone, by t0+15ms at the latest", step, h)
			}
			return
		}
	}
	r.clock.Advance(time.Millisecond)
	waitUntil(t, "both hedges at t0+50ms", func() bool { return r.obs.retries[RetryHedge].Load() == 2 })
	t.Fatal("the hedge of the query read at t0-40ms, due at t0+10ms, went out only at t0+50ms, with the later query's")
}

// Sending the hedges due takes time, and the next hedge's alarm counts from
// when they came due, not from when they were all sent: a hedge due while
// others were going out goes out as soon as they are, not its whole wait
// (at least hedgeTick) after them. Here the first hedge's send takes 5 ms
// of the pool's clock and the second hedge is due 1 ms after the first:
// it must go out with no further tick of the clock. (Its alarm was set
// after the sends, from the clock as they left it: for 6 ms after the
// first hedge, so it waited for time that had already passed.)
func TestHedgeDueDuringSlowSendsIsNotLate(t *testing.T) {
	r := newRig(t, rigConfig{n: 2, budget: generous, hedge: 100 * time.Millisecond})
	r.ups[1].decide = func([]byte) outcome {
		if r.ups[1].count() == 0 { // the first hedge: its send takes 5 ms
			r.clock.Advance(5 * time.Millisecond)
		}
		return hold
	}
	forwardAtOn(t, r, "first.example", t0)                        // hedge due t0+100ms
	forwardAtOn(t, r, "second.example", t0.Add(time.Millisecond)) // hedge due t0+101ms
	hedgerWaits(t, r)
	r.clock.Advance(100 * time.Millisecond) // the first hedge is due; its send moves the clock to t0+105ms
	waitUntil(t, "the hedge due at t0+101ms, with the clock at t0+105ms",
		func() bool { return r.obs.retries[RetryHedge].Load() == 2 })
	if now := r.clock.Now(); !now.Equal(t0.Add(105 * time.Millisecond)) {
		t.Fatalf("the clock is at t0+%v, want t0+105ms: only the first send moved it", now.Sub(t0))
	}
}
