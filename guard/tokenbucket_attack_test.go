package guard

import (
	"math"
	"testing"
	"time"
)

// Attack on the bucket's arithmetic at the edge of its range (a burst of
// 1e8, as DNS_RATE_LIMIT accepts): the balance is a float64 near 1e8, where
// one unit in the last place is 2^-26 ≈ 1.49e-8 tokens, and every call adds
// elapsed×rate to it and moves last on. When calls come closer together than
// one such unit's worth of time, each addition is rounded to a whole unit:
// up (the bucket refills up to twice its rate, past burst + rate × elapsed)
// or down to nothing (it never refills while the calls keep coming; refused
// calls included). Here 10^6 refused calls 1 ns apart, from a balance of
// 9e7: the balance must grow by rate × 1 ms. (At 2×10^8 calls: 2.98 tokens
// earned at 7.5/s where 1.5 were due, 0 at 3.5/s where 0.7 were.)
func TestAttackBucketRefillRoundsAwayNearALargeBurst(t *testing.T) {
	const steps = 1_000_000
	for _, rate := range []float64{7.5, 3.5} {
		clock := NewManualClock(t0)
		b := NewTokenBucket(rate, 100_000_000, clock)
		if !b.AllowAt(t0, 10_000_000) {
			t.Fatal("a full bucket refused a tenth of its burst")
		}
		for i := 1; i <= steps; i++ {
			b.AllowAt(t0.Add(time.Duration(i)), 100_000_000) // refused: only refills
		}
		clock.Set(t0.Add(steps))
		got, want := b.Tokens()-9e7, rate*steps*1e-9
		if math.Abs(got-want) > want/100 {
			t.Errorf("rate %v, burst 1e8: %d calls 1 ns apart earned %.6f tokens, want %.6f (rate × elapsed)", rate, steps, got, want)
		}
	}
}
