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
	r.clock.Advance(10 * time.Millisecond) // t0+10ms: the earlier query's hedge is due
	deadline := time.Now().Add(time.Second)
	for r.obs.retries[RetryHedge].Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if h := r.obs.retries[RetryHedge].Load(); h != 1 {
		r.clock.Advance(40 * time.Millisecond)
		waitUntil(t, "both hedges at t0+50ms", func() bool { return r.obs.retries[RetryHedge].Load() == 2 })
		t.Fatalf("at t0+10ms, when the query read at t0-40ms was due its hedge: %d hedges sent, want 1; it went out only at t0+50ms, with the later query's, 40ms late", h)
	}
}
