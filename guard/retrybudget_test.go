package guard

import (
	"sync"
	"testing"
	"time"
)

// budgetStep is one line of a retry budget timeline: at offset at, record
// firsts first attempts, then ask for tries retries and expect granted of
// them to be let through.
type budgetStep struct {
	at      time.Duration
	firsts  int
	tries   int
	granted int
}

func TestRetryBudgetArithmetic(t *testing.T) {
	tests := []struct {
		name  string
		cfg   RetryBudgetConfig
		steps []budgetStep
	}{
		{"a tenth of 100 first attempts, no more", RetryBudgetConfig{Ratio: 0.1, MinPerSecond: 1}, []budgetStep{
			{0, 100, 20, 10},
		}},
		{"the share never rounds up: 19 firsts give 1", RetryBudgetConfig{Ratio: 0.1, MinPerSecond: 1}, []budgetStep{
			{0, 19, 5, 1},
			{0, 1, 5, 1}, // the 20th first attempt earns the second retry
		}},
		{"the floor lets a quiet proxy retry, a few per second", RetryBudgetConfig{Ratio: 0.1, MinPerSecond: 3}, []budgetStep{
			{0, 0, 5, 3},
			{500 * time.Millisecond, 0, 5, 0}, // the same second
			{time.Second, 0, 5, 3},            // the next second
			{2500 * time.Millisecond, 1, 5, 3},
		}},
		{"floor and share are the larger of the two, never the sum", RetryBudgetConfig{Ratio: 0.1, MinPerSecond: 3}, []budgetStep{
			{0, 50, 10, 5}, // the share (5) is above the floor (3): 5, not 8
			{time.Second, 0, 10, 3},
			// 8 retries in the window against a share of 5: only the floor
		}},
		{"first attempts older than the window no longer count", RetryBudgetConfig{Ratio: 0.1, MinPerSecond: 1, Window: 10 * time.Second}, []budgetStep{
			{0, 100, 10, 10},
			{5 * time.Second, 0, 5, 1},         // the share is spent; the floor gives one
			{5500 * time.Millisecond, 0, 5, 0}, // the same second: its floor is spent
			{10 * time.Second, 0, 5, 1},        // t0's 100 and its 10 retries expired: the floor alone
			{10 * time.Second, 100, 20, 8},     // 100 new firsts: 10, two spent this window (at 5 s and 10 s)
		}},
		{"ratio 1: one retry per first attempt", RetryBudgetConfig{Ratio: 1, MinPerSecond: 1}, []budgetStep{
			{0, 7, 10, 7},
		}},
		{"a long silence forgets everything", RetryBudgetConfig{Ratio: 0.5, MinPerSecond: 2}, []budgetStep{
			{0, 100, 60, 50},
			{time.Hour, 0, 5, 2},
			{time.Hour, 10, 5, 3}, // 5 earned, 2 spent at this second
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := NewManualClock(t0)
			b := NewRetryBudget(tt.cfg, clock)
			for i, s := range tt.steps {
				clock.Set(t0.Add(s.at))
				for range s.firsts {
					b.Deposit()
				}
				got := 0
				for range s.tries {
					if b.Withdraw() {
						got++
					}
				}
				if got != s.granted {
					t.Fatalf("step %d (at %v, +%d firsts): %d of %d retries let through, want %d",
						i, s.at, s.firsts, got, s.tries, s.granted)
				}
			}
		})
	}
}

// A reading older than the newest one the budget has seen (a caller that
// read the clock, then waited for the lock) counts in the newest second: it
// never brings an expired second back.
func TestRetryBudgetStaleReading(t *testing.T) {
	clock := NewManualClock(t0)
	b := NewRetryBudget(RetryBudgetConfig{Ratio: 0.1, MinPerSecond: 1}, clock)
	for range 100 {
		b.DepositAt(t0)
	}
	now := t0.Add(20 * time.Second) // t0's firsts have expired
	if !b.WithdrawAt(now) {         // the floor
		t.Fatal("the floor refused the first retry of a second")
	}
	for range 5 {
		if b.WithdrawAt(t0) {
			t.Fatal("a stale reading brought back the expired firsts' share")
		}
	}
	if got := b.Stats(now); got.Firsts != 0 || got.Retries != 1 {
		t.Fatalf("stats %+v, want 0 firsts and 1 retry in the window", got)
	}
}

// The floor is counted in the newest second too: a stale reading from the
// second before finds this second's floor spent, not that second's empty
// slot, so the floor never lets more than MinPerSecond through in a second.
func TestRetryBudgetStaleReadingMeetsTheNewestFloor(t *testing.T) {
	b := NewRetryBudget(RetryBudgetConfig{Ratio: 0.1, MinPerSecond: 1}, NewManualClock(t0))
	if !b.WithdrawAt(t0.Add(5 * time.Second)) {
		t.Fatal("the floor refused the first retry of a second")
	}
	if b.WithdrawAt(t0.Add(4500 * time.Millisecond)) {
		t.Fatal("a reading 0.5 s stale let a second retry through a floor of 1 a second")
	}
}

// The defaults: 10% over 10 s with a floor of 3 a second.
func TestRetryBudgetDefaults(t *testing.T) {
	b := NewRetryBudget(RetryBudgetConfig{Ratio: 0.1}, NewManualClock(t0))
	if c := b.Config(); c.Window != 10*time.Second || c.MinPerSecond != 3 || c.Ratio != 0.1 {
		t.Fatalf("defaults %+v", c)
	}
	for _, bad := range []RetryBudgetConfig{{Ratio: 0}, {Ratio: -0.1}, {Ratio: 1.5}, {Ratio: 0.1, Window: 1500 * time.Millisecond}, {Ratio: 0.1, MinPerSecond: -1}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("NewRetryBudget(%+v) did not panic", bad)
				}
			}()
			NewRetryBudget(bad, nil)
		}()
	}
}

// Many goroutines on the real clock: the budget never lets through more
// than its share plus its floor for the seconds the run spans.
func TestRetryBudgetConcurrent(t *testing.T) {
	b := NewRetryBudget(RetryBudgetConfig{Ratio: 0.1, MinPerSecond: 2}, RealClock{})
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	granted := 0
	for range 8 {
		wg.Go(func() {
			n := 0
			for range 2000 {
				b.Deposit()
				if b.Withdraw() {
					n++
				}
				if b.Withdraw() {
					n++
				}
			}
			mu.Lock()
			granted += n
			mu.Unlock()
		})
	}
	waitGroupWithin(t, &wg, time.Minute)
	seconds := int(time.Since(start)/time.Second) + 1
	if limit := 16000/10 + 2*seconds; granted > limit {
		t.Fatalf("%d retries let through for 16000 first attempts over %d s, want at most %d", granted, seconds, limit)
	}
	if granted < 16000/10 {
		t.Fatalf("only %d retries let through for 16000 first attempts, want the share, %d", granted, 16000/10)
	}
}

// The share is exact at its edge for every whole percent, as dnsproxi
// builds the ratio (DNS_RETRY_BUDGET / 100): with F first attempts in the
// window, the retry that brings the count to exactly k% of F is let
// through, and the one after it is not. The first attempt counts are those
// at which ratio × F, computed in floating point, falls just short of the
// whole number k × F / 100 for some k (29% of 100 is 28.999999999999996).
func TestRetryBudgetShareIsExactAtItsEdge(t *testing.T) {
	for k := 1; k <= 100; k++ {
		for _, firsts := range []int{50, 90, 100, 150, 180, 300, 2150, 4300} {
			share := k * firsts / 100
			if k*firsts%100 != 0 || share < 2 {
				continue // not a whole number of retries, or within the floor
			}
			clock := NewManualClock(t0)
			b := NewRetryBudget(RetryBudgetConfig{Ratio: float64(k) / 100, MinPerSecond: 1}, clock)
			for range firsts {
				b.Deposit()
			}
			granted := 0
			for range share + 1 {
				if b.Withdraw() {
					granted++
				}
			}
			if granted != share {
				t.Errorf("%d%% of %d first attempts: %d retries let through, want exactly %d", k, firsts, granted, share)
			}
		}
	}
}
