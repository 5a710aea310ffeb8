package pool

import (
	"sync/atomic"
	"testing"
	"time"
)

// closedLimit is an outbound limit that counts its Close calls; a second
// one would panic, as the fleet's switch log does.
type closedLimit struct{ closes atomic.Int64 }

func (l *closedLimit) Allow(int) bool { return true }

func (l *closedLimit) Close() error {
	if l.closes.Add(1) > 1 {
		panic("the outbound limit was closed twice")
	}
	return nil
}

// Close may be called more than once, as each upstream's Close may: the
// proxy's shutdown closes the set of upstreams, and a second shutdown (a
// test's cleanup after the test's own) must not panic. With one upstream
// it never did; with several and a hedge, the hedger's stop channel was
// closed twice, and the outbound limit was closed again.
func TestCloseTwice(t *testing.T) {
	limit := &closedLimit{}
	r := newRig(t, rigConfig{n: 2, budget: generous, hedge: 100 * time.Millisecond, outbound: limit})
	if !r.pool.Hedging() {
		t.Fatal("the pool does not hedge: nothing to close twice")
	}
	for i := range 2 {
		if err := r.pool.Close(); err != nil {
			t.Fatalf("Close %d: %v", i+1, err)
		}
	}
	if n := limit.closes.Load(); n != 1 {
		t.Fatalf("the outbound limit was closed %d times, want 1", n)
	}
}
