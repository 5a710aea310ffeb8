// Package guard holds the gates of dnsproxi: an access list of client
// prefixes, a token bucket that refuses traffic beyond a rate, a bounded
// table of token buckets, one per client prefix, a three-state circuit
// breaker that stops calls to a dependency that keeps failing, and a retry
// budget that caps retries at a share of first attempts. All are pure and
// safe for concurrent use; those that depend on time read it only through a
// Clock, so tests drive them with a ManualClock instead of sleeping.
package guard

import (
	"context"
	"sync"
	"time"
)

// Clock tells the time. Production code uses RealClock; tests use a
// ManualClock so that time moves only when the test says so.
type Clock interface {
	Now() time.Time
}

// timerClock is implemented by clocks that can also wait. A Clock without it
// waits on real timers.
type timerClock interface {
	After(d time.Duration) <-chan time.Time
}

// RealClock is the wall clock. Its zero value is ready to use.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// After returns time.After(d).
func (RealClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// ManualClock is a Clock that stands still until Advance or Set moves it.
// Waiters created by After fire when the clock reaches their deadline.
// It is safe for concurrent use.
type ManualClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []manualWaiter
	changed chan struct{} // closed and replaced whenever waiters change
}

type manualWaiter struct {
	at time.Time
	ch chan time.Time
}

// NewManualClock returns a ManualClock that reads t.
func NewManualClock(t time.Time) *ManualClock {
	return &ManualClock{now: t, changed: make(chan struct{})}
}

// Now returns the clock's current reading.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d and fires the waiters now due.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.setLocked(c.now.Add(d))
	c.mu.Unlock()
}

// Set moves the clock to t, forwards or backwards, and fires the waiters now due.
func (c *ManualClock) Set(t time.Time) {
	c.mu.Lock()
	c.setLocked(t)
	c.mu.Unlock()
}

// setLocked requires that c.mu is held.
func (c *ManualClock) setLocked(t time.Time) {
	c.now = t
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(t) {
			w.ch <- t // buffered: never blocks
			continue
		}
		kept = append(kept, w)
	}
	if len(kept) != len(c.waiters) {
		clear(c.waiters[len(kept):])
		c.waiters = kept
		c.signalLocked()
	}
}

// After returns a channel that receives the clock's reading once the clock
// has advanced by d. A d <= 0 fires at once.
func (c *ManualClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, manualWaiter{at: c.now.Add(d), ch: ch})
	c.signalLocked()
	return ch
}

// signalLocked wakes BlockUntilWaiters. It requires that c.mu is held.
func (c *ManualClock) signalLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// BlockUntilWaiters waits until at least n After channels are pending, so a
// test can advance the clock only once the goroutine under test is waiting.
// It returns ctx's error if ctx ends first.
func (c *ManualClock) BlockUntilWaiters(ctx context.Context, n int) error {
	for {
		c.mu.Lock()
		have, changed := len(c.waiters), c.changed
		c.mu.Unlock()
		if have >= n {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// after waits on c's own timers when it has them, else on real ones.
func after(c Clock, d time.Duration) <-chan time.Time {
	if tc, ok := c.(timerClock); ok {
		return tc.After(d)
	}
	return time.After(d)
}
