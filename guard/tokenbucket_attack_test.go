package guard

import (
	"context"
	"errors"
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
func TestAttackBucketRefillHoldsNearALargeBurst(t *testing.T) {
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

// Allow's doc: "n greater than the burst is always refused"; WaitN's: "n
// greater than the burst returns ErrExceedsBurst at once". Both compare
// float64(n) with float64(burst), and above 2^53 an int does not survive
// the conversion: burst+1 rounds to burst, so a full bucket hands out
// more than it can hold.
func TestLearnerBucketRefusesMoreThanAHugeBurst(t *testing.T) {
	const burst = 1 << 60
	b := NewTokenBucket(1, burst, NewManualClock(t0))
	if b.Allow(burst + 1) {
		t.Errorf("Allow(burst+1) on a full bucket of burst 2^60 = true, want false (n above the burst is always refused)")
	}
	b = NewTokenBucket(1, burst, NewManualClock(t0))                         // full again
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a safety net
	defer cancel()
	if err := b.WaitN(ctx, burst+1); !errors.Is(err, ErrExceedsBurst) {
		t.Errorf("WaitN(burst+1) with burst 2^60 = %v, want ErrExceedsBurst", err)
	}
}

// The head comment's bound: "the bucket never admits more than burst +
// rate × elapsed". refill accepts an addition the balance holds to within
// 1/1024 of the tokens earned, and rounding to nearest may round up: near
// 2^49 a float64 unit is 1/8 token, a refill of 1024.51 units is stored as
// 1025, and every such refill mints 0.06 of a token. Over 100 refills of
// one second the bucket admits 6 tokens beyond its bound.
func TestLearnerBucketRefillNeverRoundsUpPastItsBound(t *testing.T) {
	const burst, half = 1 << 50, 1 << 49
	rate := 1024.51 / 8 // tokens per second: 1024.51 units of 1/8
	clock := NewManualClock(t0)
	b := NewTokenBucket(rate, burst, clock)
	if !b.AllowAt(t0, half) {
		t.Fatal("a full bucket refused half its burst")
	}
	const steps = 100
	for i := 1; i <= steps; i++ {
		b.AllowAt(t0.Add(time.Duration(i)*time.Second), burst) // refused: only refills
	}
	bound := rate * steps // what 100 s may earn, beyond the half left
	n := half + int(math.Floor(bound)) + 1
	if b.AllowAt(t0.Add(steps*time.Second), n) {
		t.Errorf("after %d s at %v/s the bucket admitted %d more than half its burst; "+
			"burst + rate × elapsed allows at most %.3f (balance now %.3f beyond half)",
			steps, rate, n-half, bound, b.Tokens()+float64(n)-half)
	}
}
