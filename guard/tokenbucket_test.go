package guard

import (
	"context"
	"errors"
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

func TestTokenBucketClockBackwardsMintsNothing(t *testing.T) {
	clock := NewManualClock(t0)
	b := NewTokenBucket(10, 5, clock)
	b.Allow(5)
	clock.Set(t0.Add(-time.Hour))
	if b.Allow(1) {
		t.Fatal("a backwards step minted a token")
	}
	clock.Set(t0.Add(-time.Hour + 100*time.Millisecond)) // 100 ms after the new reading: one token
	if !b.Allow(1) || b.Allow(1) {
		t.Fatal("after the step back, 100 ms should earn exactly one token")
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
	clock.Advance(299 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("WaitN returned %v after 299 ms, want it to wait 300 ms", err)
	default:
	}
	clock.Advance(time.Millisecond)
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
