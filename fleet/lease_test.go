package fleet

import (
	"sync"
	"testing"
	"time"
)

// TestLeaseSteps walks a lease through grants, spending and expiry on a
// timeline: spending is oldest first, so an expiring block takes with it
// only what is left of itself.
func TestLeaseSteps(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var s lease
	type step struct {
		name   string
		do     func()
		tokens int64 // in hand after the step
		spent  int64 // spent() after the step
	}
	take := func(n int64, want bool) func() {
		return func() {
			if ok, _ := s.take(n); ok != want {
				t.Errorf("take(%d) = %v, want %v", n, ok, want)
			}
		}
	}
	steps := []step{
		{"empty lease refuses", take(1, false), 0, 0},
		{"block of 10 until t0+900ms", func() { s.add(10, t0.Add(leaseLife)) }, 10, 0},
		{"spend 4", take(4, true), 6, 4},
		{"block of 5 until t0+1s", func() { s.add(5, t0.Add(time.Second)) }, 11, 0},
		{"more than in hand is refused whole", take(12, false), 11, 0},
		{"spend 3", take(3, true), 8, 3},
		{"t0+899ms: nothing expired", func() { s.expire(t0.Add(leaseLife - time.Millisecond)) }, 8, 0},
		{"t0+900ms: the first block's 3 left go", func() {
			if cut := s.expire(t0.Add(leaseLife)); cut != 3 {
				t.Errorf("cut %d, want 3", cut)
			}
		}, 5, 0},
		{"spend 5", take(5, true), 0, 5},
		{"t0+1s: nothing left to cut", func() { s.expire(t0.Add(time.Second)) }, 0, 0},
		{"zero-sized grant adds no block", func() { s.add(0, t0.Add(2*time.Second)) }, 0, 0},
	}
	for _, st := range steps {
		st.do()
		if got := s.tokens.Load(); got != st.tokens {
			t.Fatalf("%s: %d tokens in hand, want %d", st.name, got, st.tokens)
		}
		if got := s.spent(); got != st.spent {
			t.Fatalf("%s: spent %d, want %d", st.name, got, st.spent)
		}
	}
	if _, ok := s.nextExpiry(); ok {
		t.Errorf("blocks left after all expired: %v", s.blocks)
	}
}

// TestLeaseConcurrentTake: many goroutines spending one lease never spend
// more than it holds, and spend all of it.
func TestLeaseConcurrentTake(t *testing.T) {
	var s lease
	s.add(10_000, time.Unix(1, 0))
	var wg sync.WaitGroup
	got := make([]int64, 8)
	for g := range got {
		wg.Go(func() {
			for range 3000 {
				if ok, _ := s.take(1); ok {
					got[g]++
				}
			}
		})
	}
	wg.Wait()
	var total int64
	for _, n := range got {
		total += n
	}
	if total != 10_000 || s.tokens.Load() != 0 {
		t.Errorf("spent %d of 10000, %d left", total, s.tokens.Load())
	}
	if spent := s.spent(); spent != 10_000 {
		t.Errorf("spent() = %d, want 10000", spent)
	}
}

// TestLeaseAsks: take says the next block is wanted once the lease falls
// below its low-water mark, and when it is short.
func TestLeaseAsks(t *testing.T) {
	var s lease
	s.low.Store(5)
	s.add(8, time.Unix(1, 0))
	steps := []struct {
		n       int64
		ok, ask bool
	}{
		{2, true, false}, // 6 left
		{1, true, false}, // 5 left: not below
		{1, true, true},  // 4 left
		{5, false, true}, // short
	}
	for i, st := range steps {
		if ok, ask := s.take(st.n); ok != st.ok || ask != st.ask {
			t.Errorf("step %d take(%d) = %v, %v; want %v, %v", i, st.n, ok, ask, st.ok, st.ask)
		}
	}
}
