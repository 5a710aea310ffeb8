package guard

// The token bucket, as the chapter states it:
//
//   - The bucket holds at most burst tokens and starts full.
//   - Tokens come back at rate per second. The refill is lazy: every call
//     first adds elapsed×rate, capped at burst, so an idle bucket costs
//     nothing and no goroutine or timer runs for it.
//   - Allow(n) takes n tokens now or refuses, taking none.
//   - WaitN(ctx, n) takes n tokens now even if that drives the balance below
//     zero (debt), then waits until the debt is paid. If ctx ends first the
//     tokens are given back.
//   - Time only counts forward: tokens are earned from the latest reading
//     the bucket has seen, and an earlier reading (a caller that read the
//     clock, then waited for the lock) earns nothing and moves nothing. So no
//     interval is counted twice, whatever order readings arrive in, and the
//     bucket never admits more than burst + rate × elapsed. A clock that
//     steps backwards mints nothing until it passes its latest reading again
//     (RealClock cannot: Go's readings carry a monotonic clock).

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// ErrExceedsBurst is returned by WaitN when n is more than the bucket can ever hold.
var ErrExceedsBurst = errors.New("guard: request exceeds the bucket's burst")

// TokenBucket is a rate limiter: rate tokens per second, at most burst at once.
// It is safe for concurrent use. Build it with NewTokenBucket.
type TokenBucket struct {
	mu     sync.Mutex
	tokens float64   // may be negative while WaitN callers are in debt
	last   time.Time // the reading up to which tokens were refilled

	rate   float64 // tokens per second
	burst  float64
	burstN int // burst as given: n is compared with it, not with the float, which cannot tell burst from burst+1 above 2^53
	clock  Clock
	real   bool // clock is RealClock: call time.Now directly, no interface call
}

// NewTokenBucket returns a full bucket that refills at rate tokens per second
// up to burst tokens, reading time from c (RealClock{} in production).
// It panics if rate <= 0 or burst < 1; callers validate configuration first.
func NewTokenBucket(rate float64, burst int, c Clock) *TokenBucket {
	if !(rate > 0) {
		panic(fmt.Sprintf("guard: token bucket rate must be > 0, got %v", rate))
	}
	if burst < 1 {
		panic(fmt.Sprintf("guard: token bucket burst must be >= 1, got %d", burst))
	}
	if c == nil {
		c = RealClock{}
	}
	_, real := c.(RealClock)
	return &TokenBucket{
		tokens: float64(burst),
		last:   c.Now(),
		rate:   rate,
		burst:  float64(burst),
		burstN: burst,
		clock:  c,
		real:   real,
	}
}

func (b *TokenBucket) now() time.Time {
	if b.real {
		return time.Now()
	}
	return b.clock.Now()
}

// Allow takes n tokens if the bucket holds them and reports whether it did.
// A refused call takes nothing. n greater than the burst is always refused;
// n <= 0 takes nothing and is allowed.
func (b *TokenBucket) Allow(n int) bool {
	if n <= 0 {
		return true // nothing to take, as with WaitN: never a way to add tokens
	}
	// The clock is read outside the lock, which stays short; a reading that
	// went stale while waiting for it earns nothing (see refill).
	return b.AllowAt(b.now(), n)
}

// AllowAt is Allow with the clock read by the caller, who may share one
// reading among several gates. A reading older than one already applied
// earns nothing and moves nothing back (see refill).
func (b *TokenBucket) AllowAt(now time.Time, n int) bool {
	if n <= 0 {
		return true
	}
	if n > b.burstN {
		return false
	}
	need := float64(n)
	b.mu.Lock()
	b.refill(now)
	ok := b.tokens >= need
	if ok {
		b.tokens -= need
	}
	b.mu.Unlock()
	return ok
}

// Tokens returns the balance now, negative while callers are in debt.
func (b *TokenBucket) Tokens() float64 {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(now)
	return b.tokens
}

// WaitN takes n tokens now, going into debt if it must, and blocks until the
// debt is paid. If ctx ends first, or its deadline falls before the debt can
// be paid, the n tokens are given back and the error says why.
// n greater than the burst returns ErrExceedsBurst at once. A debt that would
// take longer than a time.Duration holds (about 292 years, at a tiny rate)
// waits that long: in practice, until ctx ends.
func (b *TokenBucket) WaitN(ctx context.Context, n int) error {
	if n <= 0 {
		return nil
	}
	if n > b.burstN {
		return fmt.Errorf("%w: %d > %d", ErrExceedsBurst, n, b.burstN)
	}
	need := float64(n)
	if err := ctx.Err(); err != nil {
		return err
	}
	now := b.now()
	b.mu.Lock()
	b.refill(now)
	b.tokens -= need
	wait := b.debtWait()
	if wait > 0 && b.last.After(now) {
		// now is older than the latest reading (stale, or the clock stepped
		// back): the debt is paid debt/rate after that reading, and the wait
		// counts from now.
		behind := b.last.Sub(now)
		wait = min(wait, maxWait-behind) + behind
	}
	b.mu.Unlock()
	if wait == 0 {
		return nil
	}
	// A context deadline is a wall-clock time; only the real clock can be compared with it.
	if deadline, ok := ctx.Deadline(); ok && b.real && deadline.Before(now.Add(wait)) {
		b.giveBack(need)
		return fmt.Errorf("guard: waiting %v for %d tokens would pass the context's deadline: %w",
			wait, n, context.DeadlineExceeded)
	}
	select {
	case <-after(b.clock, wait):
		return nil
	case <-ctx.Done():
		b.giveBack(need)
		return ctx.Err()
	}
}

// Take is shorthand for WaitN(ctx, 1).
func (b *TokenBucket) Take(ctx context.Context) error { return b.WaitN(ctx, 1) }

// giveBack returns tokens taken by a WaitN that did not go through.
func (b *TokenBucket) giveBack(n float64) { b.giveBackAt(b.now(), n) }

// giveBackAt returns n tokens taken and not used, at the reading now: the
// balance is capped at the burst, so a token given back after the bucket
// refilled over it leaves the bucket as if it had never been taken.
func (b *TokenBucket) giveBackAt(now time.Time, n float64) {
	b.mu.Lock()
	b.refill(now)
	b.tokens = min(b.tokens+n, b.burst)
	b.mu.Unlock()
}

// refill adds the tokens earned since b.last, capped at the burst, and moves
// b.last to now. A reading no later than b.last changes nothing: its time has
// been counted already.
//
// The balance is a float64, and near a large burst one unit in its last
// place is a sizeable sum (2^-26 tokens near 1e8): a smaller addition would
// be rounded to a whole unit, up or down, and calls coming often enough
// would refill the bucket at up to twice its rate, or not at all. So a sum
// rounded up is taken one unit down — the bucket never holds a token it
// did not earn (TestLearnerBucketRefillNeverRoundsUpPastItsBound) — and the
// tokens earned are added only once the balance holds them to 1/1024;
// until then last stays where it is and the time adds up
// (TestAttackBucketRefillHoldsNearALargeBurst). At the usual sizes
// every addition holds: a microsecond at 1 token/s is 1e-6, against units
// of 1e-13 near a balance of 1000.
// It requires that b.mu is held.
func (b *TokenBucket) refill(now time.Time) {
	elapsed := now.Sub(b.last)
	if elapsed <= 0 {
		return // a stale reading, or a clock that stepped back: never move last backwards
	}
	if b.tokens >= b.burst {
		b.last = now
		return
	}
	earned := elapsed.Seconds() * b.rate
	tokens := b.tokens + earned
	if tokens-b.tokens > earned {
		tokens = math.Nextafter(tokens, math.Inf(-1)) // rounded up: never mint what was not earned
	}
	if tokens < b.burst && tokens-b.tokens < earned-earned/1024 {
		return // too little for the balance to hold yet
	}
	b.tokens, b.last = min(tokens, b.burst), now
}

// maxWait is the longest wait a time.Duration holds, about 292 years.
const maxWait = time.Duration(math.MaxInt64)

// debtWait is how long until a negative balance is back to zero, at most
// maxWait: at a tiny rate a debt can take longer than a Duration holds.
// It requires that b.mu is held.
func (b *TokenBucket) debtWait() time.Duration {
	if b.tokens >= 0 {
		return 0
	}
	ns := math.Ceil(-b.tokens / b.rate * float64(time.Second))
	if ns >= float64(maxWait) { // converting it would overflow: Go leaves the result undefined
		return maxWait
	}
	return time.Duration(ns)
}
