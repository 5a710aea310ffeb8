package guard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// step is one line of a token bucket timeline: at offset at, ask for n tokens
// and expect ok.
type step struct {
	at time.Duration
	n  int
	ok bool
}

func TestTokenBucketAllow(t *testing.T) {
	tests := []struct {
		name  string
		rate  float64
		burst int
		steps []step
	}{
		{"starts full, then refuses", 10, 5, []step{
			{0, 1, true}, {0, 1, true}, {0, 1, true}, {0, 1, true}, {0, 1, true}, {0, 1, false},
		}},
		{"refills at rate", 10, 5, []step{
			{0, 5, true}, {0, 1, false},
			{200 * time.Millisecond, 1, true}, {200 * time.Millisecond, 1, true}, {200 * time.Millisecond, 1, false},
		}},
		{"n above burst is always refused", 10, 5, []step{{0, 6, false}, {time.Hour, 6, false}, {time.Hour, 5, true}}},
		{"a refused call takes nothing", 1, 3, []step{{0, 2, true}, {0, 2, false}, {0, 1, true}, {0, 1, false}}},
		{"refill is capped at burst", 100, 2, []step{{0, 2, true}, {time.Minute, 3, false}, {time.Minute, 2, true}}},
		{"fractional rate", 0.5, 1, []step{{0, 1, true}, {time.Second, 1, false}, {2 * time.Second, 1, true}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := NewManualClock(t0)
			b := NewTokenBucket(tt.rate, tt.burst, clock)
			for i, s := range tt.steps {
				clock.Set(t0.Add(s.at))
				if got := b.Allow(s.n); got != s.ok {
					t.Fatalf("step %d (at %v, n=%d): Allow = %v, want %v", i, s.at, s.n, got, s.ok)
				}
			}
		})
	}
}

// The chapter's numbers: rate=10, burst=5, idle 1 s → exactly 5, then 0.2 s → 2 more.
func TestTokenBucketChapterNumbers(t *testing.T) {
	clock := NewManualClock(t0)
	b := NewTokenBucket(10, 5, clock)
	b.Allow(5)
	clock.Advance(time.Second)
	if got := countAllowed(b, 100); got != 5 {
		t.Fatalf("after 1 s idle: %d allowed in a row, want 5", got)
	}
	clock.Advance(200 * time.Millisecond)
	if got := countAllowed(b, 100); got != 2 {
		t.Fatalf("0.2 s later: %d allowed, want 2", got)
	}
}

func countAllowed(b *TokenBucket, tries int) int {
	n := 0
	for range tries {
		if b.Allow(1) {
			n++
		}
	}
	return n
}

// TestTokenBucketReadingsOutOfOrder delivers clock readings in the order
// concurrent callers can: one reads the clock, another reads it later and
// takes the lock first, then the first arrives with its older reading. At each
// reading the bucket is drained. No interval may be counted twice: what is
// admitted never exceeds burst + rate × (latest reading − start).
func TestTokenBucketReadingsOutOfOrder(t *testing.T) {
	const rate, burst = 10, 5 // one token per 100 ms
	ms := time.Millisecond
	tests := []struct {
		name     string
		readings []time.Duration // offsets from the bucket's start
		want     int
	}{
		{"in order", []time.Duration{0, 100 * ms, 200 * ms, 300 * ms}, burst + 3},
		{"a stale reading between two fresh ones", []time.Duration{0, 100 * ms, 0, 100 * ms}, burst + 1},
		{"stale readings again and again", []time.Duration{0, 300 * ms, 100 * ms, 300 * ms, 200 * ms, 300 * ms, 0, 300 * ms}, burst + 3},
		{"a stale reading, then a later one", []time.Duration{0, 200 * ms, 100 * ms, 300 * ms}, burst + 3},
		{"the clock steps back an hour", []time.Duration{0, 100 * ms, -time.Hour, -time.Hour + 100*ms, 100 * ms, 200 * ms}, burst + 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := NewManualClock(t0)
			b := NewTokenBucket(rate, burst, clock)
			admitted, latest := 0, time.Duration(0)
			for _, at := range tt.readings {
				clock.Set(t0.Add(at))
				latest = max(latest, at)
				admitted += countAllowed(b, 1000)
			}
			if bound := burst + rate*latest.Seconds(); float64(admitted) > bound {
				t.Fatalf("readings %v admitted %d, more than burst + rate × elapsed = %v", tt.readings, admitted, bound)
			}
			if admitted != tt.want {
				t.Fatalf("readings %v admitted %d, want %d", tt.readings, admitted, tt.want)
			}
		})
	}
}

// TestTokenBucketBoundUnderConcurrency hammers one bucket from many goroutines
// on the real clock. The rate is far below the call rate, so the bucket is
// nearly always empty and any interval counted twice shows as excess; the
// burst holds 100 ms of tokens, so a caller whose reading went stale while it
// was descheduled could mint that much again. elapsed runs from before the
// bucket is built to after the last call returned, so burst + rate × elapsed
// is a bound the bucket must keep.
func TestTokenBucketBoundUnderConcurrency(t *testing.T) {
	const (
		rate     = 500.0
		burst    = 50
		run      = 300 * time.Millisecond
		maxCalls = 20_000_000 // per goroutine: a bound on count besides the one on time
	)
	for _, n := range []int{2, 8, 64} {
		t.Run(fmt.Sprintf("goroutines=%d", n), func(t *testing.T) {
			start := time.Now()
			b := NewTokenBucket(rate, burst, RealClock{})
			stop := start.Add(run)
			var admitted, calls atomic.Int64
			var wg sync.WaitGroup
			for range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var mine, tries int64
					for ; tries < maxCalls; tries++ {
						if tries%64 == 0 && time.Now().After(stop) {
							break
						}
						if b.Allow(1) {
							mine++
						}
					}
					admitted.Add(mine)
					calls.Add(tries)
				}()
			}
			waitGroupWithin(t, &wg, 30*time.Second)
			elapsed := time.Since(start)

			bound := burst + rate*elapsed.Seconds()
			t.Logf("%d goroutines, %v: %d calls, %d admitted, bound %.0f",
				n, elapsed.Round(time.Millisecond), calls.Load(), admitted.Load(), bound)
			if got := float64(admitted.Load()); got > bound {
				t.Fatalf("%d goroutines admitted %d in %v, more than burst + rate × elapsed = %.0f (%.2f×)",
					n, admitted.Load(), elapsed, bound, got/bound)
			}
			if calls.Load() < 10*int64(bound) {
				t.Fatalf("only %d calls for a bound of %.0f: too few to put the bound to the test", calls.Load(), bound)
			}
		})
	}
}

// waitGroupWithin waits for wg, failing the test if that takes longer than d.
func waitGroupWithin(t *testing.T, wg *sync.WaitGroup, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("goroutines still running after %v", d)
	}
}

func TestTokenBucketWaitNDebt(t *testing.T) {
	clock := NewManualClock(t0)
	b := NewTokenBucket(10, 5, clock)
	b.Allow(5) // empty

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a safety net, not a state wait
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- b.WaitN(ctx, 3) }() // 3 tokens of debt at 10/s: 300 ms
	if err := clock.BlockUntilWaiters(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if got := b.Tokens(); got != -3 {
		t.Fatalf("balance while waiting = %v, want -3 (debt)", got)
	}
	clock.Advance(300*time.Millisecond - time.Nanosecond)
	if !timersPending(clock, 1) {
		t.Fatal("WaitN's timer fired before 300 ms, with 3 tokens of debt at 10/s")
	}
	clock.Advance(time.Nanosecond)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WaitN = %v", err)
		}
	case <-ctx.Done():
		t.Fatal("WaitN did not return once the debt was paid")
	}
	if b.Allow(1) {
		t.Fatal("the paid reservation's tokens were handed out twice")
	}
}

func TestTokenBucketWaitNCancelGivesTokensBack(t *testing.T) {
	clock := NewManualClock(t0)
	b := NewTokenBucket(10, 5, clock)
	b.Allow(4) // 1 left

	ctx, cancel := context.WithCancel(context.Background())
	safety, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- b.WaitN(ctx, 3) }()
	if err := clock.BlockUntilWaiters(safety, 1); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("WaitN = %v, want context.Canceled", err)
		}
	case <-safety.Done():
		t.Fatal("WaitN ignored the cancellation")
	}
	if got := b.Tokens(); got != 1 {
		t.Fatalf("balance after cancel = %v, want the 1 token from before", got)
	}
}

func TestTokenBucketWaitNErrors(t *testing.T) {
	clock := NewManualClock(t0)
	b := NewTokenBucket(10, 5, clock)
	if err := b.WaitN(context.Background(), 6); !errors.Is(err, ErrExceedsBurst) {
		t.Errorf("WaitN(6) with burst 5 = %v, want ErrExceedsBurst", err)
	}
	b.Allow(5)
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(50*time.Millisecond))
	defer cancel()
	// The manual clock stands still, so the debt (1 s) can never be paid before a real 50 ms deadline.
	if err := b.WaitN(ctx, 5); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitN past the deadline = %v, want DeadlineExceeded", err)
	}
	if got := b.Tokens(); got != 0 {
		t.Errorf("balance after a refused wait = %v, want 0", got)
	}
	done, cancelNow := context.WithCancel(context.Background())
	cancelNow()
	if err := b.Take(done); !errors.Is(err, context.Canceled) {
		t.Errorf("Take on a cancelled context = %v, want Canceled", err)
	}
}

// TestTokenBucketWaitNTinyRate: at 1e-12 tokens per second one token of debt
// takes 1e12 s, longer than a time.Duration can hold. WaitN must still wait
// (until its context ends, in practice), and a context deadline that comes
// first refuses at once, giving the tokens back.
func TestTokenBucketWaitNTinyRate(t *testing.T) {
	const tiny = 1e-12
	t.Run("waits until cancelled", func(t *testing.T) {
		clock := NewManualClock(t0)
		b := NewTokenBucket(tiny, 1, clock)
		b.Allow(1)
		done, cancel := waitNBlocks(t, clock, b, 1)
		clock.Advance(100 * 365 * 24 * time.Hour) // a century pays 3e-3 of the token
		if !timersPending(clock, 1) {
			t.Fatal("WaitN's timer fired after a century, with a debt of 31 700 years")
		}
		cancel()
		if err := receiveWithin(t, done, 10*time.Second); !errors.Is(err, context.Canceled) {
			t.Fatalf("WaitN = %v, want context.Canceled", err)
		}
		if got := b.Tokens(); got < 0 || got >= 1 {
			t.Fatalf("balance after the cancelled wait = %v, want the debt given back (0 ≤ balance < 1)", got)
		}
	})
	t.Run("a deadline refuses at once", func(t *testing.T) {
		b := NewTokenBucket(tiny, 1, RealClock{})
		b.Allow(1)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.WaitN(ctx, 1); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WaitN with a 10 s deadline = %v, want DeadlineExceeded", err)
		}
		if ctx.Err() != nil {
			t.Fatal("WaitN waited for the deadline instead of refusing at once")
		}
		if got := b.Tokens(); got < 0 || got >= 1 {
			t.Fatalf("balance after the refused wait = %v, want the debt given back (0 ≤ balance < 1)", got)
		}
	})
}

// TestTokenBucketExtremeValues builds buckets at the edges of what the
// constructor accepts: nothing panics, no balance becomes NaN or leaves
// [-n, burst], and a debt always waits, paid in 1 ns at a huge rate and never
// within a time.Duration at a tiny one.
func TestTokenBucketExtremeValues(t *testing.T) {
	tests := []struct {
		name  string
		rate  float64
		burst int
		payIn time.Duration // how long one token of debt waits; 0: longer than any Duration
	}{
		{"huge rate, huge burst", 1e300, math.MaxInt, time.Nanosecond},
		{"largest rate", math.MaxFloat64, 1, time.Nanosecond},
		{"tiny rate, huge burst", 1e-12, math.MaxInt, 0},
		{"smallest rate", math.SmallestNonzeroFloat64, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := NewManualClock(t0)
			b := NewTokenBucket(tt.rate, tt.burst, clock)
			if !b.Allow(tt.burst) {
				t.Fatal("a new bucket did not hand out its burst")
			}
			if got := b.Tokens(); got != 0 {
				t.Fatalf("balance after taking the burst = %v, want 0", got)
			}
			done, cancel := waitNBlocks(t, clock, b, 1)
			if tt.payIn > 0 {
				clock.Advance(tt.payIn)
				if err := receiveWithin(t, done, 10*time.Second); err != nil {
					t.Fatalf("WaitN = %v once its debt was paid", err)
				}
			} else {
				clock.Advance(100 * 365 * 24 * time.Hour)
				if !timersPending(clock, 1) {
					t.Fatal("WaitN's timer fired after a century of clock time")
				}
				cancel()
				if err := receiveWithin(t, done, 10*time.Second); !errors.Is(err, context.Canceled) {
					t.Fatalf("WaitN = %v, want context.Canceled", err)
				}
			}
			clock.Advance(time.Duration(math.MaxInt64))
			got := b.Tokens()
			if math.IsNaN(got) || got < 0 || got > float64(tt.burst) {
				t.Fatalf("balance after the longest Duration = %v, want within [0, %d]", got, tt.burst)
			}
			if tt.payIn > 0 && got != float64(tt.burst) {
				t.Fatalf("balance after the longest Duration = %v, want the bucket full (%d)", got, tt.burst)
			}
		})
	}
}

// waitNBlocks starts b.WaitN(ctx, n) on its own goroutine and fails the test
// unless WaitN waits on the manual clock rather than returning at once. It
// returns the channel WaitN's result arrives on and the cancel of its ctx.
func waitNBlocks(t *testing.T, clock *ManualClock, b *TokenBucket, n int) (<-chan error, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	safety, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- b.WaitN(ctx, n) }()
	waiting := make(chan error, 1)
	go func() { waiting <- clock.BlockUntilWaiters(safety, 1) }()
	select {
	case err := <-done:
		t.Fatalf("WaitN(%d) returned %v at once, with a debt it cannot have paid", n, err)
	case err := <-waiting:
		if err != nil {
			t.Fatalf("WaitN(%d) never started waiting: %v", n, err)
		}
	}
	return done, cancel
}

// timersPending reports whether at least n manual timers are pending now.
// Looking at WaitN's result channel right after Advance proves nothing: a
// timer that Advance fired returns WaitN on WaitN's own goroutine, later, so
// the channel is empty either way. The count of waiters is exact at once:
// asked with a context already ended, BlockUntilWaiters answers from the
// count it sees.
func timersPending(clock *ManualClock, n int) bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return clock.BlockUntilWaiters(ctx, n) == nil
}

// receiveWithin returns what ch delivers, failing the test if nothing comes within d.
func receiveWithin(t *testing.T, ch <-chan error, d time.Duration) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(d):
		t.Fatalf("nothing within %v", d)
		return nil
	}
}

func TestTokenBucketTakeImmediate(t *testing.T) {
	b := NewTokenBucket(10, 2, NewManualClock(t0))
	for i := range 2 {
		if err := b.Take(context.Background()); err != nil {
			t.Fatalf("Take %d with tokens in the bucket = %v", i, err)
		}
	}
	if b.Allow(1) {
		t.Fatal("Take did not take a token")
	}
}

func TestNewTokenBucketRejects(t *testing.T) {
	for _, tt := range []struct {
		name  string
		rate  float64
		burst int
	}{{"zero rate", 0, 1}, {"negative rate", -1, 1}, {"zero burst", 1, 0}} {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			NewTokenBucket(tt.rate, tt.burst, RealClock{})
		})
	}
}

// "The bucket never admits more than burst + rate × elapsed": Allow(-k), like
// WaitN(-k), takes nothing (it added k tokens above the burst).
func TestTokenBucketAllowNegativeMintsNothing(t *testing.T) {
	clock := NewManualClock(time.Unix(1000, 0))
	b := NewTokenBucket(1, 5, clock)
	if !b.Allow(-1000) || !b.Allow(0) {
		t.Fatal("Allow(n <= 0) refused; it takes nothing and is allowed")
	}
	admitted := 0
	for range 2000 {
		if b.Allow(1) {
			admitted++
		}
	}
	if admitted > 5 {
		t.Fatalf("with no time passing, a bucket of burst 5 admitted %d after Allow(-1000) (balance now %v)", admitted, b.Tokens())
	}
}

// TestTokenBucketAllowAt runs a timeline of caller readings, a stale one
// among them: the bucket's own clock never moves, so only the readings
// passed in count, and the stale one earns nothing and moves nothing back.
func TestTokenBucketAllowAt(t *testing.T) {
	b := NewTokenBucket(10, 2, NewManualClock(t0)) // 1 token per 100 ms
	steps := []step{
		{0, 2, true},
		{0, 1, false},
		{100 * time.Millisecond, 1, true},  // earned one
		{50 * time.Millisecond, 1, false},  // stale: earns nothing
		{150 * time.Millisecond, 1, false}, // 50 ms after the latest reading: half a token
		{200 * time.Millisecond, 1, true},
		{0, 0, true}, // n <= 0 takes nothing
	}
	for i, s := range steps {
		if got := b.AllowAt(t0.Add(s.at), s.n); got != s.ok {
			t.Fatalf("step %d (at %v, n=%d): AllowAt = %v, want %v", i, s.at, s.n, got, s.ok)
		}
	}
}

// WaitN with a context already ended takes nothing, even from a full
// bucket: the caller has given up and will not make the call.
func TestTokenBucketWaitNWithAnEndedContext(t *testing.T) {
	b := NewTokenBucket(10, 2, NewManualClock(t0))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := b.WaitN(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitN with an ended context = %v, want context.Canceled", err)
	}
	if got := b.Tokens(); got != 2 {
		t.Fatalf("balance after WaitN with an ended context = %v, want 2 (nothing taken)", got)
	}
}

// A stale reading that finds the bucket full moves nothing back either:
// refill's shortcut for a full bucket keeps last at the latest reading. Were
// last moved back to the stale reading, the span from it to the latest would
// be earned a second time, and a full bucket would admit more than its burst
// with no time passing.
func TestTokenBucketStaleReadingOnAFullBucket(t *testing.T) {
	for _, stale := range []time.Duration{500 * time.Millisecond, -time.Hour} {
		t.Run(fmt.Sprintf("stale reading at %v", stale), func(t *testing.T) {
			clock := NewManualClock(t0)
			b := NewTokenBucket(10, 2, clock) // 1 token per 100 ms
			clock.Set(t0.Add(time.Second))
			if got := b.Tokens(); got != 2 {
				t.Fatalf("balance after an idle second = %v, want 2 (full)", got)
			}
			if !b.AllowAt(t0.Add(stale), 1) {
				t.Fatal("a full bucket refused one token at a stale reading")
			}
			if b.AllowAt(t0.Add(time.Second), 2) {
				t.Fatalf("at the latest reading again, the bucket admitted 2 more: 3 tokens at one instant, burst 2 "+
					"(the stale reading at %v moved last back)", stale)
			}
		})
	}
}

// giveBackAt caps the balance at the burst: a token given back after the
// bucket refilled over it is not kept on top. (WaitN gives back when its
// timer fires late, after the debt was paid; AllowWithAt when the client's
// bucket refuses after the shared token was taken.)
func TestTokenBucketGiveBackIsCappedAtTheBurst(t *testing.T) {
	clock := NewManualClock(t0)
	b := NewTokenBucket(10, 2, clock)
	if !b.AllowAt(t0, 2) {
		t.Fatal("a new bucket did not hand out its burst")
	}
	b.giveBackAt(t0.Add(time.Second), 2) // a second later: refilled to 2, and 2 come back
	if got := b.Tokens(); got != 2 {
		t.Fatalf("balance = %v after the bucket refilled and the 2 tokens came back, want 2 (the burst)", got)
	}
}

// The bound holds with waiters too: on the real clock, goroutines that
// Allow and goroutines that WaitN for 1 to 3 tokens under contexts that end
// within 0.5 to 10 ms (so that many waits are refused at once for their
// deadline, or end with it and give their tokens back) together never get
// more than burst + rate × elapsed, counting every token a WaitN returned
// nil for. A token given back twice shows as excess (5% over, when
// giveBack returned 2n); a debt's length is TestTokenBucketWaitNDebt's.
func TestTokenBucketBoundWithWaiters(t *testing.T) {
	const (
		rate     = 2000.0
		burst    = 20
		run      = 300 * time.Millisecond
		maxCalls = 5_000_000 // per goroutine: a bound on count besides the one on time
	)
	start := time.Now()
	b := NewTokenBucket(rate, burst, RealClock{})
	stop := start.Add(run)
	var admitted, calls, waited, gaveUp atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			var mine, tries int64
			for ; tries < maxCalls && time.Now().Before(stop); tries++ {
				if g%2 == 0 {
					if b.Allow(1) {
						mine++
					}
					continue
				}
				n := int(tries%3) + 1
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(500+tries%20*500)*time.Microsecond)
				if err := b.WaitN(ctx, n); err == nil {
					mine += int64(n)
					waited.Add(1)
				} else {
					gaveUp.Add(1)
				}
				cancel()
			}
			admitted.Add(mine)
			calls.Add(tries)
		})
	}
	waitGroupWithin(t, &wg, 30*time.Second)
	elapsed := time.Since(start)
	bound := burst + rate*elapsed.Seconds()
	t.Logf("%v: %d calls, %d tokens admitted (%d waits went through, %d gave up), bound %.0f",
		elapsed.Round(time.Millisecond), calls.Load(), admitted.Load(), waited.Load(), gaveUp.Load(), bound)
	if got := float64(admitted.Load()); got > bound {
		t.Fatalf("admitted %d tokens in %v, more than burst + rate × elapsed = %.0f (%.3f×)", admitted.Load(), elapsed, bound, got/bound)
	}
	if waited.Load() == 0 || gaveUp.Load() == 0 {
		t.Fatalf("%d waits went through and %d gave up: the run did not exercise both", waited.Load(), gaveUp.Load())
	}
	if calls.Load() < 10*int64(bound) {
		t.Fatalf("only %d calls for a bound of %.0f: too few to put the bound to the test", calls.Load(), bound)
	}
}

// A clock that steps back mints nothing until it passes its latest reading
// again, and a debt is no way around that: WaitN's tokens are earned
// debt/rate after the latest reading the bucket has seen, so the wait
// counts from there, not from the caller's earlier reading. Here the bucket
// is emptied at t0+10s and the clock steps back to t0+5s: one token of debt
// at 1/s is paid at t0+11s. (WaitN waited 1 s from t0+5s and returned at
// t0+6s, a token the bucket had not earned.)
func TestTokenBucketWaitNAfterTheClockSteppedBack(t *testing.T) {
	clock := NewManualClock(t0.Add(10 * time.Second))
	b := NewTokenBucket(1, 1, clock)
	if !b.Allow(1) {
		t.Fatal("a new bucket did not hand out its burst")
	}
	clock.Set(t0.Add(5 * time.Second))
	done, _ := waitNBlocks(t, clock, b, 1)
	stillWaiting := func() bool {
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // no wait: only whether the waiter is still there
		return clock.BlockUntilWaiters(ctx, 1) == nil
	}
	for _, at := range []time.Duration{6 * time.Second, 10 * time.Second, 10999 * time.Millisecond} {
		clock.Set(t0.Add(at))
		if !stillWaiting() {
			t.Fatalf("WaitN's wait ended at t0+%v; the bucket earns its token only at t0+11s", at)
		}
	}
	clock.Set(t0.Add(11 * time.Second))
	if err := receiveWithin(t, done, 10*time.Second); err != nil {
		t.Fatalf("WaitN = %v once its debt was paid", err)
	}
	if b.Allow(1) {
		t.Fatal("the token paid to WaitN was handed out again")
	}
}
