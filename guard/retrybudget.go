package guard

// The retry budget, as the chapter's companion notes state it:
//
//   - Every first attempt deposits; every retry (or hedge: a second attempt
//     of any kind) withdraws one.
//   - A retry is let through while, counting it, the retries over the last
//     Window stay within Ratio of the first attempts over the same Window:
//     at 10% a sick dependency gets at most 1.1 calls per request above
//     the floor below, never the 2× or 3× that retrying every failure would
//     send it. (Under the floor, at fewer first attempts a second than it
//     allows retries, it can be up to 2×: those are few calls.)
//   - A small floor, MinPerSecond retries in any one second, lets a quiet
//     process retry its first failures before it has earned a share. The
//     floor is counted per second and the share per window, so they meet
//     in each second: a retry goes through if the share has room or this
//     second has let fewer than MinPerSecond through, and a retry let
//     through by either counts against both. Within one second the budget
//     is the larger of the two, never their sum; across the seconds of a
//     window whose share is spent, the floor lets MinPerSecond through in
//     each of them.
//   - Time is cut into whole seconds, kept in a ring of Window/1s slots;
//     a slot older than the window is forgotten when the clock passes it
//     (lazily, on the next call: no timers). Only the newest second moves
//     state: a reading older than it (a caller that read the clock, then
//     waited for the lock) counts in the newest second and never brings an
//     expired one back.
//
// A refused retry costs nothing: the caller answers with what it has.

import (
	"fmt"
	"sync"
	"time"
)

// RetryBudgetConfig sets a RetryBudget's rules. A zero field takes its
// default, except Ratio, which has none.
type RetryBudgetConfig struct {
	Ratio        float64       // retries per first attempt over the window, 0 < x <= 1 (dnsproxi: 0.1)
	MinPerSecond int           // retries let through in any one second whatever the traffic (default 3)
	Window       time.Duration // the span the share is counted over, whole seconds (default 10s)
}

// RetryBudget caps retries at a share of first attempts. It is safe for
// concurrent use. Build it with NewRetryBudget.
type RetryBudget struct {
	mu      sync.Mutex
	slots   []budgetSlot // slot of second s: s % len(slots)
	newest  int64        // the newest second seen, counted from epoch
	firsts  int64        // over the window
	retries int64        // over the window

	cfg   RetryBudgetConfig
	epoch time.Time
	clock Clock
	real  bool // clock is RealClock: call time.Now directly, no interface call
}

type budgetSlot struct{ firsts, retries int64 }

// RetryBudgetStats is what a budget counts over its window.
type RetryBudgetStats struct {
	Firsts, Retries int64
}

// NewRetryBudget returns a budget with cfg's rules (zero fields take their
// defaults), reading time from c (RealClock{} in production). It panics on a
// configuration that cannot work; callers validate first.
func NewRetryBudget(cfg RetryBudgetConfig, c Clock) *RetryBudget {
	if cfg.MinPerSecond == 0 {
		cfg.MinPerSecond = 3
	}
	if cfg.Window == 0 {
		cfg.Window = 10 * time.Second
	}
	switch {
	case !(cfg.Ratio > 0 && cfg.Ratio <= 1):
		panic(fmt.Sprintf("guard: retry budget ratio must be in (0, 1], got %v", cfg.Ratio))
	case cfg.MinPerSecond < 0:
		panic(fmt.Sprintf("guard: retry budget floor must be >= 0, got %d", cfg.MinPerSecond))
	case cfg.Window < time.Second || cfg.Window%time.Second != 0:
		panic(fmt.Sprintf("guard: retry budget window must be whole seconds, at least 1s, got %v", cfg.Window))
	}
	if c == nil {
		c = RealClock{}
	}
	_, real := c.(RealClock)
	return &RetryBudget{
		slots: make([]budgetSlot, cfg.Window/time.Second),
		cfg:   cfg,
		epoch: c.Now(),
		clock: c,
		real:  real,
	}
}

// Config returns the budget's rules with the defaults filled in.
func (b *RetryBudget) Config() RetryBudgetConfig { return b.cfg }

func (b *RetryBudget) now() time.Time {
	if b.real {
		return time.Now()
	}
	return b.clock.Now()
}

// Deposit records one first attempt now: shorthand for DepositAt(now).
func (b *RetryBudget) Deposit() { b.DepositAt(b.now()) }

// DepositAt records one first attempt at now.
func (b *RetryBudget) DepositAt(now time.Time) {
	b.mu.Lock()
	s := b.advance(now)
	s.firsts++
	b.firsts++
	b.mu.Unlock()
}

// Withdraw takes one retry if the budget allows it now and reports whether
// it did: shorthand for WithdrawAt(now).
func (b *RetryBudget) Withdraw() bool { return b.WithdrawAt(b.now()) }

// WithdrawAt takes one retry if the budget allows it at now and reports
// whether it did. A refused retry takes nothing.
func (b *RetryBudget) WithdrawAt(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.advance(now)
	// A quotient, not ratio × firsts: the division is rounded once, so when
	// the retries are exactly the share (29 of 100 at 0.29) it equals the
	// ratio, as the breaker's failures/samples does; the product can fall
	// short (0.29 × 100 = 28.999999999999996). No first attempts: +Inf.
	withinShare := float64(b.retries+1)/float64(b.firsts) <= b.cfg.Ratio
	if !withinShare && s.retries >= int64(b.cfg.MinPerSecond) {
		return false
	}
	s.retries++
	b.retries++
	return true
}

// Stats returns the counts over the window as of now.
func (b *RetryBudget) Stats(now time.Time) RetryBudgetStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now)
	return RetryBudgetStats{Firsts: b.firsts, Retries: b.retries}
}

// advance forgets the seconds that now has pushed out of the window and
// returns the slot of the newest second. A reading no later than the newest
// second changes nothing and counts in that second.
// It requires that b.mu is held.
func (b *RetryBudget) advance(now time.Time) *budgetSlot {
	n := int64(len(b.slots))
	sec := int64(now.Sub(b.epoch) / time.Second)
	if sec > b.newest {
		// Clear the slots of the seconds between, at most the whole ring.
		for s := b.newest + 1; s <= sec && s <= b.newest+n; s++ {
			old := &b.slots[s%n]
			b.firsts -= old.firsts
			b.retries -= old.retries
			*old = budgetSlot{}
		}
		b.newest = sec
	}
	return &b.slots[b.newest%n]
}
