package guard

// The circuit breaker, as the chapter states it:
//
//   - Closed: calls go through and their outcomes fill a ring buffer of the
//     last Window outcomes. When the window holds at least MinSamples
//     outcomes and failures/samples >= FailThreshold, the breaker opens.
//   - Open: every Allow returns ErrOpen at once. Once CoolOff has passed
//     (checked lazily on Allow: no timers) the breaker goes half-open.
//   - Half-open: exactly one call, the probe, is let through; everyone else
//     gets ErrOpen. The probe's success closes the breaker with a cleared
//     window; its failure opens it again and restarts the cool-off.
//   - A call that says nothing about the dependency (it was cut short by
//     shutdown, or failed for a reason of its own) ends with Permit.Cancel:
//     it is no sample at all. A cancelled probe decides nothing and frees
//     its place, so the next call probes.
//
// Every transition starts a new generation, and so does a cancelled probe.
// Two hazards follow from calls that outlive a transition, and this is how
// each is handled:
//
//   - A late result from a call admitted before the trip must not decide the
//     half-open probe. Acquire hands out a Permit stamped with the
//     generation, and Permit.Success/Failure are ignored once the generation
//     has moved on. The shorthand Allow/MarkSuccess/MarkFailure report to the
//     current generation; it is safe when every call ends within CoolOff,
//     which is why dnsproxi requires the cool-off to exceed the upstream
//     timeout.
//   - A probe whose result never comes back must not wedge the breaker in
//     half-open. A probe that has not reported within CoolOff counts as
//     failed: the next Allow re-opens the breaker and restarts the cool-off,
//     and a report that comes after it, success or not, opens it too.
//     A probe with nothing to report says so with Cancel and frees its place
//     at once; the shorthand has no Cancel, so a probe let through by Allow
//     that has nothing to report waits out that deadline.

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// State is one of the breaker's three states.
type State int

// The breaker's states.
const (
	Closed State = iota
	HalfOpen
	Open
)

// String returns "closed", "half-open" or "open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case HalfOpen:
		return "half-open"
	case Open:
		return "open"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// ErrOpen is returned by Allow and Acquire when the breaker lets no call through.
var ErrOpen = errors.New("guard: circuit breaker is open")

// BreakerConfig sets a Breaker's rules. A zero field takes its default.
type BreakerConfig struct {
	Window        int           // ring buffer size: the last N outcomes (default 100)
	MinSamples    int           // no trip below this many outcomes in the window (default 20, at most Window)
	FailThreshold float64       // trip when failures/samples >= this, 0 < x <= 1 (default 0.5)
	CoolOff       time.Duration // open → half-open after this long; also the probe's deadline (default 5s)
}

// Breaker is a three-state circuit breaker. It is safe for concurrent use.
// Build it with NewBreaker.
type Breaker struct {
	// closedGen is gen+1 while the breaker is closed and 0 otherwise, so the
	// closed path of Acquire reads it without the lock. It sits on a cache
	// line of its own (padding both sides, since the struct itself need not
	// start on one): mu is written on every Mark, closedGen only on
	// transitions, and sharing a line would make every Acquire miss.
	_         [64]byte
	closedGen atomic.Uint64
	_         [64]byte

	mu       sync.Mutex
	state    State
	gen      uint64    // bumped on every transition, and when a probe is cancelled
	since    time.Time // when the current state began (open: the cool-off's start)
	probing  bool      // half-open: the probe is out
	probeAt  time.Time // half-open: when the probe was let through
	outcomes ring

	cfg   BreakerConfig
	clock Clock

	onChange    func(from, to State)
	undelivered []transition // transitions not yet handed to onChange, oldest first
	dispatching bool         // a goroutine is running onChange
}

type transition struct{ from, to State }

// Permit is what Acquire hands to a call it lets through; the call ends it
// exactly once, with Success, Failure, or Cancel when its outcome says
// nothing about the dependency. The zero Permit reports nothing. A Permit
// is a value and cannot tell it was ended before: a copy ended twice in
// the generation it was taken in counts twice while the breaker stays
// closed (a half-open probe's second end, after a transition or a Cancel,
// is ignored). Whoever ends one drops it, as the pool does.
type Permit struct {
	b   *Breaker
	gen uint64
}

// NewBreaker returns a closed breaker with cfg's rules (zero fields take their
// defaults), reading time from c (RealClock{} in production).
// It panics on a configuration that cannot work; callers validate first.
func NewBreaker(cfg BreakerConfig, c Clock) *Breaker {
	if cfg.Window == 0 {
		cfg.Window = 100
	}
	if cfg.MinSamples == 0 {
		cfg.MinSamples = min(20, cfg.Window)
	}
	if cfg.FailThreshold == 0 {
		cfg.FailThreshold = 0.5
	}
	if cfg.CoolOff == 0 {
		cfg.CoolOff = 5 * time.Second
	}
	switch {
	case cfg.Window < 1:
		panic(fmt.Sprintf("guard: breaker window must be >= 1, got %d", cfg.Window))
	case cfg.MinSamples < 1 || cfg.MinSamples > cfg.Window:
		panic(fmt.Sprintf("guard: breaker min samples must be 1..%d (the window), got %d", cfg.Window, cfg.MinSamples))
	case !(cfg.FailThreshold > 0 && cfg.FailThreshold <= 1):
		panic(fmt.Sprintf("guard: breaker fail threshold must be in (0, 1], got %v", cfg.FailThreshold))
	case cfg.CoolOff < 0:
		panic(fmt.Sprintf("guard: breaker cool-off must be > 0, got %v", cfg.CoolOff))
	}
	if c == nil {
		c = RealClock{}
	}
	b := &Breaker{
		since:    c.Now(),
		outcomes: ring{failed: make([]bool, cfg.Window)},
		cfg:      cfg,
		clock:    c,
	}
	b.closedGen.Store(b.gen + 1)
	return b
}

// Config returns the breaker's rules with the defaults filled in.
func (b *Breaker) Config() BreakerConfig { return b.cfg }

// OnStateChange sets fn to be called after every transition, in the order
// they happen, outside the breaker's lock: fn may call State or any other
// method. Set it before the breaker is used.
func (b *Breaker) OnStateChange(fn func(from, to State)) {
	b.mu.Lock()
	b.onChange = fn
	b.mu.Unlock()
}

// State returns the current state. An open breaker whose cool-off has passed
// reports Open until the next Allow moves it to half-open.
func (b *Breaker) State() State {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// Allow reports whether a call may go ahead: nil, and the caller must then
// report the outcome with MarkSuccess or MarkFailure; or ErrOpen, and the
// caller must not make the call.
func (b *Breaker) Allow() error {
	_, err := b.Acquire()
	return err
}

// MarkSuccess reports that a call let through by Allow succeeded.
func (b *Breaker) MarkSuccess() {
	b.mu.Lock()
	b.record(false)
}

// MarkFailure reports that a call let through by Allow failed.
func (b *Breaker) MarkFailure() {
	b.mu.Lock()
	b.record(true)
}

// Acquire is Allow with a Permit: the call reports through it, and a report
// that arrives after the breaker has changed state is ignored.
func (b *Breaker) Acquire() (Permit, error) {
	if g := b.closedGen.Load(); g != 0 { // the hot path: no lock, no clock read
		return Permit{b: b, gen: g - 1}, nil
	}
	b.mu.Lock()
	if b.state == Closed { // closed since the load above
		p := Permit{b: b, gen: b.gen}
		b.mu.Unlock()
		return p, nil
	}
	now := b.clock.Now()
	changed := false
	if b.state == Open && now.Sub(b.since) >= b.cfg.CoolOff {
		b.setState(HalfOpen, now)
		changed = true
	}
	if b.state == HalfOpen && b.probing && now.Sub(b.probeAt) >= b.cfg.CoolOff {
		b.setState(Open, now) // the probe is lost: count it as failed
		changed = true
	}
	var p Permit
	err := ErrOpen
	if b.state == HalfOpen && !b.probing {
		b.probing, b.probeAt = true, now
		p, err = Permit{b: b, gen: b.gen}, nil
	}
	b.mu.Unlock()
	if changed {
		b.dispatch()
	}
	return p, err
}

// Success reports that the permitted call succeeded.
func (p Permit) Success() {
	if p.b != nil {
		p.b.mark(p.gen, false)
	}
}

// Failure reports that the permitted call failed.
func (p Permit) Failure() {
	if p.b != nil {
		p.b.mark(p.gen, true)
	}
}

// Cancel ends the permitted call without an outcome: it counts neither as a
// success nor as a failure. If the call was the half-open probe, its place
// is freed and the next call becomes the probe — unless its deadline has
// passed: a probe silent past CoolOff is the lost probe of the head
// comment, counted failed whether it then reports, cancels, or a call
// comes in first to find it lost, so the breaker re-opens.
func (p Permit) Cancel() {
	if p.b == nil || p.b.closedGen.Load() == p.gen+1 {
		return // closed in the permit's generation: no probe to free, nothing to record
	}
	b := p.b
	b.mu.Lock()
	if p.gen != b.gen || b.state != HalfOpen {
		b.mu.Unlock()
		return
	}
	// In half-open the only permit of a generation is the probe's. A new
	// generation spends it: a second Cancel or a late report through it
	// cannot touch the next probe.
	if now := b.clock.Now(); now.Sub(b.probeAt) >= b.cfg.CoolOff {
		b.setState(Open, now)
		b.mu.Unlock()
		b.dispatch()
		return
	}
	b.probing = false
	b.gen++
	b.mu.Unlock()
}

// mark records one outcome of generation gen; a late one is dropped.
func (b *Breaker) mark(gen uint64, failed bool) {
	b.mu.Lock()
	if gen != b.gen {
		b.mu.Unlock()
		return
	}
	b.record(failed)
}

// record applies one outcome to the current generation. It requires that
// b.mu is held, and releases it.
func (b *Breaker) record(failed bool) {
	changed := false
	switch b.state {
	case Closed:
		b.outcomes.record(failed)
		if b.outcomes.samples >= b.cfg.MinSamples &&
			float64(b.outcomes.failures)/float64(b.outcomes.samples) >= b.cfg.FailThreshold {
			b.setState(Open, b.clock.Now())
			changed = true
		}
	case HalfOpen:
		if b.probing {
			// A probe reporting past its deadline is the lost probe of the
			// head comment, counted failed whether or not a call came in
			// meanwhile to find it lost.
			now := b.clock.Now()
			to := Closed
			if failed || now.Sub(b.probeAt) >= b.cfg.CoolOff {
				to = Open
			}
			b.setState(to, now)
			changed = true
		}
	case Open:
		// Nothing was let through in this generation; nothing to record.
	}
	b.mu.Unlock()
	if changed {
		b.dispatch()
	}
}

// setState moves to a new state and generation and queues the transition for
// onChange. It requires that b.mu is held.
func (b *Breaker) setState(to State, now time.Time) {
	from := b.state
	b.state, b.since, b.probing = to, now, false
	b.gen++
	b.closedGen.Store(0)
	if to == Closed {
		b.outcomes.clear()
		b.closedGen.Store(b.gen + 1)
	}
	if b.onChange != nil {
		b.undelivered = append(b.undelivered, transition{from, to})
	}
}

// dispatch hands queued transitions to onChange in order, outside the lock.
// Only one goroutine dispatches at a time; the others leave their
// transitions in the queue for it.
func (b *Breaker) dispatch() {
	b.mu.Lock()
	if b.dispatching {
		b.mu.Unlock()
		return
	}
	b.dispatching = true
	for len(b.undelivered) > 0 {
		t, fn := b.undelivered[0], b.onChange
		b.undelivered = b.undelivered[1:]
		b.mu.Unlock()
		fn(t.from, t.to)
		b.mu.Lock()
	}
	b.undelivered = nil
	b.dispatching = false
	b.mu.Unlock()
}

// ring holds the last len(failed) outcomes. Recording and clearing are O(1).
type ring struct {
	failed   []bool // failed[i]: the outcome in slot i was a failure
	next     int    // the slot the next outcome goes in
	samples  int    // slots in use, at most len(failed)
	failures int    // failures among the slots in use
}

func (r *ring) record(failed bool) {
	if r.samples == len(r.failed) {
		if r.failed[r.next] { // overwrite the oldest outcome
			r.failures--
		}
	} else {
		r.samples++
	}
	r.failed[r.next] = failed
	if failed {
		r.failures++
	}
	r.next++
	if r.next == len(r.failed) {
		r.next = 0
	}
}

// clear forgets every outcome. Old slots need no wiping: a slot is read only
// after it has been written again.
func (r *ring) clear() { r.next, r.samples, r.failures = 0, 0, 0 }
