package guard

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func newTestBreaker(t *testing.T, cfg BreakerConfig) (*Breaker, *ManualClock) {
	t.Helper()
	clock := NewManualClock(t0)
	return NewBreaker(cfg, clock), clock
}

// call lets one call through the simple API and reports it; it fails the
// test if the breaker refused.
func call(t *testing.T, b *Breaker, failed bool) {
	t.Helper()
	if err := b.Allow(); err != nil {
		t.Fatalf("Allow in state %v = %v, want nil", b.State(), err)
	}
	if failed {
		b.MarkFailure()
	} else {
		b.MarkSuccess()
	}
}

// trip drives a fresh breaker to Open with failures only.
func trip(t *testing.T, b *Breaker) {
	t.Helper()
	for range b.Config().MinSamples {
		call(t, b, true)
	}
	if b.State() != Open {
		t.Fatalf("after %d failures state = %v, want open", b.Config().MinSamples, b.State())
	}
}

func TestBreakerTrips(t *testing.T) {
	tests := []struct {
		name     string
		cfg      BreakerConfig
		outcomes string // S success, F failure, in order
		want     State
	}{
		{"2 successes + 2 failures at MinSamples=4, 50%", BreakerConfig{MinSamples: 4, FailThreshold: 0.5}, "SSFF", Open},
		{"the ratio is checked on a success too", BreakerConfig{MinSamples: 4, FailThreshold: 0.5}, "FFSS", Open},
		{"19 failures with MinSamples=20 do not trip", BreakerConfig{MinSamples: 20, FailThreshold: 0.5}, "FFFFFFFFFFFFFFFFFFF", Closed},
		{"the 20th failure trips", BreakerConfig{MinSamples: 20, FailThreshold: 0.5}, "FFFFFFFFFFFFFFFFFFFF", Open},
		{"below the threshold stays closed", BreakerConfig{MinSamples: 4, FailThreshold: 0.5}, "SSSFSF", Closed},
		{"threshold 30% is exact at 3 of 10", BreakerConfig{MinSamples: 10, FailThreshold: 0.3}, "SSSSSSSFFF", Open},
		{"100% needs every outcome to fail", BreakerConfig{MinSamples: 4, FailThreshold: 1}, "FFFSFFF", Closed},
		{"old outcomes leave the window", BreakerConfig{Window: 4, MinSamples: 4, FailThreshold: 0.75}, "FFSSSSFF", Closed},
		{"the window slides onto failures", BreakerConfig{Window: 4, MinSamples: 4, FailThreshold: 0.75}, "SSSSFFF", Open},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, _ := newTestBreaker(t, tt.cfg)
			for _, o := range tt.outcomes {
				call(t, b, o == 'F')
			}
			if got := b.State(); got != tt.want {
				t.Fatalf("after %s: state %v, want %v", tt.outcomes, got, tt.want)
			}
		})
	}
}

func TestBreakerOpenRefusesUntilCoolOff(t *testing.T) {
	b, clock := newTestBreaker(t, BreakerConfig{MinSamples: 4, CoolOff: 5 * time.Second})
	trip(t, b)
	for _, at := range []time.Duration{0, time.Second, 4999 * time.Millisecond} {
		clock.Set(t0.Add(at))
		if err := b.Allow(); !errors.Is(err, ErrOpen) {
			t.Fatalf("Allow %v after the trip = %v, want ErrOpen", at, err)
		}
	}
	clock.Set(t0.Add(5 * time.Second))
	if err := b.Allow(); err != nil {
		t.Fatalf("Allow after the cool-off = %v, want the probe let through", err)
	}
	if b.State() != HalfOpen {
		t.Fatalf("state = %v, want half-open", b.State())
	}
}

func TestBreakerHalfOpenAdmitsOneProbe(t *testing.T) {
	b, clock := newTestBreaker(t, BreakerConfig{MinSamples: 4, CoolOff: time.Second})
	trip(t, b)
	clock.Advance(time.Second)
	if err := b.Allow(); err != nil {
		t.Fatalf("first Allow after the cool-off = %v", err)
	}
	for i := range 10 {
		if err := b.Allow(); !errors.Is(err, ErrOpen) {
			t.Fatalf("Allow %d while the probe is out = %v, want ErrOpen", i, err)
		}
	}
}

func TestBreakerProbeOutcome(t *testing.T) {
	t.Run("success closes with a cleared window", func(t *testing.T) {
		b, clock := newTestBreaker(t, BreakerConfig{MinSamples: 4, CoolOff: time.Second})
		trip(t, b)
		clock.Advance(time.Second)
		call(t, b, false)
		if b.State() != Closed {
			t.Fatalf("state = %v, want closed", b.State())
		}
		for range 3 { // the window was cleared: 3 failures are below MinSamples again
			call(t, b, true)
		}
		if b.State() != Closed {
			t.Fatalf("3 failures after closing tripped it: the window was not cleared")
		}
		call(t, b, true)
		if b.State() != Open {
			t.Fatalf("4 failures after closing: state %v, want open", b.State())
		}
	})
	t.Run("failure re-opens and restarts the cool-off", func(t *testing.T) {
		b, clock := newTestBreaker(t, BreakerConfig{MinSamples: 4, CoolOff: time.Second})
		trip(t, b)
		clock.Advance(time.Second)
		call(t, b, true)
		if b.State() != Open {
			t.Fatalf("state = %v, want open", b.State())
		}
		clock.Advance(999 * time.Millisecond)
		if err := b.Allow(); !errors.Is(err, ErrOpen) {
			t.Fatalf("Allow before the new cool-off ended = %v, want ErrOpen", err)
		}
		clock.Advance(time.Millisecond)
		if err := b.Allow(); err != nil {
			t.Fatalf("Allow after the new cool-off = %v, want a probe", err)
		}
	})
}

// Hazard 1: a call admitted before the trip reports while the probe is out.
func TestBreakerLateResultDoesNotDecideProbe(t *testing.T) {
	for _, late := range []struct {
		name   string
		report func(Permit)
	}{{"late success", Permit.Success}, {"late failure", Permit.Failure}} {
		t.Run(late.name, func(t *testing.T) {
			b, clock := newTestBreaker(t, BreakerConfig{MinSamples: 4, CoolOff: time.Second})
			slow, err := b.Acquire() // admitted while closed, answers much later
			if err != nil {
				t.Fatal(err)
			}
			trip(t, b)
			clock.Advance(time.Second)
			probe, err := b.Acquire()
			if err != nil {
				t.Fatalf("probe refused: %v", err)
			}
			late.report(slow)
			if b.State() != HalfOpen {
				t.Fatalf("a late result moved the breaker to %v; it must wait for the probe", b.State())
			}
			probe.Success()
			if b.State() != Closed {
				t.Fatalf("after the probe's success: %v, want closed", b.State())
			}
			late.report(slow) // reporting twice, or into the next generation, changes nothing either
			if b.State() != Closed {
				t.Fatalf("a stale result reached the new closed window")
			}
		})
	}
}

// Hazard 2: a probe whose result never comes back.
func TestBreakerLostProbeDoesNotWedge(t *testing.T) {
	b, clock := newTestBreaker(t, BreakerConfig{MinSamples: 4, CoolOff: time.Second})
	trip(t, b)
	clock.Advance(time.Second)
	lost, err := b.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(999 * time.Millisecond)
	if err := b.Allow(); !errors.Is(err, ErrOpen) {
		t.Fatalf("within the probe's deadline: %v, want ErrOpen", err)
	}
	clock.Advance(time.Millisecond) // the probe is now CoolOff old: counted as failed
	if err := b.Allow(); !errors.Is(err, ErrOpen) || b.State() != Open {
		t.Fatalf("lost probe: Allow = %v, state %v; want ErrOpen and open with a fresh cool-off", err, b.State())
	}
	lost.Success() // its answer finally arrives: too late to count
	if b.State() != Open {
		t.Fatalf("the lost probe's late answer moved the breaker to %v", b.State())
	}
	clock.Advance(time.Second)
	call(t, b, false)
	if b.State() != Closed {
		t.Fatalf("a new probe after the fresh cool-off should close it; state %v", b.State())
	}
}

// A call with nothing to say about the dependency (shutdown, a slow name)
// ends with Cancel: it is no sample, neither success nor failure.
func TestBreakerCancelRecordsNothing(t *testing.T) {
	tests := []struct {
		name     string
		outcomes string // S success, F failure, C cancel, in order
		want     State
	}{
		{"cancels alone never trip", "CCCCCCCCCCCCCCCCCCCCCCCC", Closed},
		{"cancels are no samples: 3 failures stay below MinSamples", "FCFCFCCCCC", Closed},
		{"cancels are no successes: the 4th failure trips", "FCFCFCCCCCF", Open},
		{"cancels do not dilute the ratio", "SSCCCCCCFF", Open},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, _ := newTestBreaker(t, BreakerConfig{MinSamples: 4, FailThreshold: 0.5})
			for _, o := range tt.outcomes {
				p, err := b.Acquire()
				if err != nil {
					t.Fatalf("Acquire in state %v = %v", b.State(), err)
				}
				switch o {
				case 'S':
					p.Success()
				case 'F':
					p.Failure()
				case 'C':
					p.Cancel()
				}
			}
			if got := b.State(); got != tt.want {
				t.Fatalf("after %s: state %v, want %v", tt.outcomes, got, tt.want)
			}
		})
	}
}

// A cancelled probe frees its place at once: the next call probes, with no
// wait for the lost-probe deadline (hazard 2).
func TestBreakerCancelledProbeFreesItsPlace(t *testing.T) {
	b, clock := newTestBreaker(t, BreakerConfig{MinSamples: 4, CoolOff: time.Second})
	trip(t, b)
	clock.Advance(time.Second)
	probe, err := b.Acquire()
	if err != nil {
		t.Fatalf("probe refused: %v", err)
	}
	if err := b.Allow(); !errors.Is(err, ErrOpen) {
		t.Fatalf("while the probe is out: %v, want ErrOpen", err)
	}
	probe.Cancel()
	if s := b.State(); s != HalfOpen {
		t.Fatalf("a cancelled probe moved the breaker to %v; it must decide nothing", s)
	}
	next, err := b.Acquire() // the clock has not moved
	if err != nil {
		t.Fatalf("after the probe was cancelled: %v, want the next call let through as the probe", err)
	}
	if err := b.Allow(); !errors.Is(err, ErrOpen) {
		t.Fatalf("while the second probe is out: %v, want ErrOpen: still one probe at a time", err)
	}
	probe.Cancel() // cancelling again frees nothing: the place is the second probe's
	if err := b.Allow(); !errors.Is(err, ErrOpen) {
		t.Fatalf("a second Cancel of the first probe freed the second probe's place: %v", err)
	}
	next.Success()
	if s := b.State(); s != Closed {
		t.Fatalf("after the second probe's success: %v, want closed", s)
	}
}

// A permit from an earlier generation cannot free the current probe's place.
func TestBreakerLateCancelDoesNotFreeTheProbe(t *testing.T) {
	b, clock := newTestBreaker(t, BreakerConfig{MinSamples: 4, CoolOff: time.Second})
	slow, err := b.Acquire() // admitted while closed, cancelled much later
	if err != nil {
		t.Fatal(err)
	}
	trip(t, b)
	clock.Advance(time.Second)
	if _, err := b.Acquire(); err != nil {
		t.Fatalf("probe refused: %v", err)
	}
	slow.Cancel()
	if err := b.Allow(); !errors.Is(err, ErrOpen) {
		t.Fatalf("a late Cancel let a second probe through: %v", err)
	}
	var zero Permit
	zero.Cancel() // the zero Permit (gate off) cancels nothing, and does not panic
}

func TestBreakerOnStateChangeOrder(t *testing.T) {
	b, clock := newTestBreaker(t, BreakerConfig{MinSamples: 4, CoolOff: time.Second})
	var got []string
	b.OnStateChange(func(from, to State) {
		// The callback may read the state: no deadlock, and it sees where it landed.
		if s := b.State(); s != to {
			t.Errorf("State() inside the callback = %v, want %v", s, to)
		}
		got = append(got, from.String()+"→"+to.String())
	})
	trip(t, b)                 // closed → open
	clock.Advance(time.Second) //
	call(t, b, true)           // open → half-open → open
	clock.Advance(time.Second)
	call(t, b, false) // open → half-open → closed
	want := []string{"closed→open", "open→half-open", "half-open→open", "open→half-open", "half-open→closed"}
	if !slices.Equal(got, want) {
		t.Fatalf("transitions\n got %v\nwant %v", got, want)
	}
}

func TestBreakerOnStateChangeReentrant(t *testing.T) {
	b, clock := newTestBreaker(t, BreakerConfig{MinSamples: 1, CoolOff: time.Second})
	var got []State
	b.OnStateChange(func(from, to State) {
		got = append(got, to)
		if to == Open {
			clock.Advance(time.Second)
			_ = b.Allow() // moves to half-open from inside the callback
		}
	})
	call(t, b, true)
	if want := []State{Open, HalfOpen}; !slices.Equal(got, want) {
		t.Fatalf("transitions %v, want %v, in order", got, want)
	}
}

// A shorthand report in half-open with no probe out (the probe was
// cancelled) comes from a call no one let through in this generation: it
// decides nothing, and the next call is the probe.
func TestBreakerShorthandReportWithNoProbeOut(t *testing.T) {
	for _, report := range []struct {
		name string
		mark func(*Breaker)
	}{{"MarkSuccess", (*Breaker).MarkSuccess}, {"MarkFailure", (*Breaker).MarkFailure}} {
		t.Run(report.name, func(t *testing.T) {
			b, clock := newTestBreaker(t, BreakerConfig{MinSamples: 4, CoolOff: time.Second})
			trip(t, b)
			clock.Advance(time.Second)
			probe, err := b.Acquire()
			if err != nil {
				t.Fatal(err)
			}
			probe.Cancel()
			report.mark(b)
			if s := b.State(); s != HalfOpen {
				t.Fatalf("%s with no probe out moved the breaker to %v; want half-open", report.name, s)
			}
			if _, err := b.Acquire(); err != nil {
				t.Fatalf("the next call after it: %v, want it let through as the probe", err)
			}
		})
	}
}

// Transitions made while the callback runs wait in the queue and come out
// in the order they happened: here the callback for the first trip moves
// the breaker twice (to half-open, and back to open with a failed probe)
// before it returns.
func TestBreakerOnStateChangeQueuedInOrder(t *testing.T) {
	b, clock := newTestBreaker(t, BreakerConfig{MinSamples: 1, CoolOff: time.Second})
	var got []string
	b.OnStateChange(func(from, to State) {
		got = append(got, from.String()+"→"+to.String())
		if len(got) == 1 {
			clock.Advance(time.Second)
			p, err := b.Acquire() // open → half-open, queued
			if err != nil {
				t.Errorf("the probe was refused: %v", err)
				return
			}
			p.Failure() // half-open → open, queued behind it
		}
	})
	call(t, b, true)
	if want := []string{"closed→open", "open→half-open", "half-open→open"}; !slices.Equal(got, want) {
		t.Fatalf("transitions\n got %v\nwant %v", got, want)
	}
}

// One goroutine runs the callback at a time: a transition made on another
// goroutine while it runs is queued, its caller returns at once, and the
// goroutine already running the callback delivers it next.
func TestBreakerOnStateChangeOneAtATime(t *testing.T) {
	b, clock := newTestBreaker(t, BreakerConfig{MinSamples: 1, CoolOff: time.Second})
	entered := make(chan State, 4)
	release := make(chan struct{})
	var running atomic.Int32
	b.OnStateChange(func(from, to State) {
		if n := running.Add(1); n > 1 {
			t.Errorf("%d callbacks running at once (%v→%v)", n, from, to)
		}
		entered <- to
		if to == Open {
			<-release // hold the first callback while the test makes another transition
		}
		running.Add(-1)
	})
	safety, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	receive := func(ch <-chan State, what string) State {
		t.Helper()
		select {
		case s := <-ch:
			return s
		case <-safety.Done():
			t.Fatalf("%s: nothing within 10 s", what)
			return 0
		}
	}
	tripped := make(chan struct{})
	go func() {
		defer close(tripped)
		if b.Allow() == nil {
			b.MarkFailure() // closed → open: this goroutine runs the callback, held
		}
	}()
	if s := receive(entered, "the trip's callback"); s != Open {
		t.Fatalf("first callback for %v, want open", s)
	}
	probed := make(chan State, 1)
	go func() {
		clock.Advance(time.Second)
		_ = b.Allow() // open → half-open while the first callback is held
		probed <- b.State()
	}()
	if s := receive(probed, "Allow while the callback runs"); s != HalfOpen {
		t.Fatalf("state after the probe's Allow = %v, want half-open", s)
	}
	select {
	case s := <-entered:
		t.Fatalf("the callback for %v ran while the one before it was still running", s)
	default: // the transition is queued: the held callback has not returned, so nothing can have run it
	}
	close(release)
	if s := receive(entered, "the queued transition"); s != HalfOpen {
		t.Fatalf("second callback for %v, want half-open", s)
	}
	select {
	case <-tripped:
	case <-safety.Done():
		t.Fatal("the goroutine running the callback never returned")
	}
}

func TestBreakerConcurrent(t *testing.T) {
	b, clock := newTestBreaker(t, BreakerConfig{Window: 50, MinSamples: 10, CoolOff: time.Millisecond})
	var mu sync.Mutex
	last := Closed
	b.OnStateChange(func(from, to State) {
		mu.Lock()
		defer mu.Unlock()
		if from != last {
			t.Errorf("transition %v→%v does not start where the last one ended (%v)", from, to, last)
		}
		last = to
	})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				p, err := b.Acquire()
				if i%100 == 0 {
					clock.Advance(time.Millisecond)
				}
				if err != nil {
					continue
				}
				switch (i + g) % 5 {
				case 0, 3:
					p.Failure()
				case 4:
					p.Cancel()
				default:
					p.Success()
				}
				if i%7 == 0 {
					_ = b.Allow()
					b.MarkSuccess()
				}
			}
		})
	}
	waitGroupWithin(t, &wg, time.Minute)
	mu.Lock()
	defer mu.Unlock()
	if s := b.State(); s != last {
		t.Fatalf("final state %v, but the last transition seen ended in %v", s, last)
	}
}

func TestNewBreakerDefaultsAndRejects(t *testing.T) {
	b := NewBreaker(BreakerConfig{}, nil)
	want := BreakerConfig{Window: 100, MinSamples: 20, FailThreshold: 0.5, CoolOff: 5 * time.Second}
	if got := b.Config(); got != want {
		t.Fatalf("defaults = %+v, want %+v", got, want)
	}
	for _, cfg := range []BreakerConfig{
		{Window: -1}, {Window: 10, MinSamples: 11}, {FailThreshold: 1.5}, {FailThreshold: -0.1}, {CoolOff: -time.Second},
	} {
		t.Run("", func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatalf("NewBreaker(%+v) did not panic", cfg)
				}
			}()
			NewBreaker(cfg, nil)
		})
	}
}

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{Closed: "closed", HalfOpen: "half-open", Open: "open", State(7): "State(7)"} {
		if s.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(s), s.String(), want)
		}
	}
}

// The threshold is exact at every whole percent, as dnsproxi builds it
// (DNS_BREAKER_THRESHOLD / 100): with the window full, f failures of n trip
// the breaker exactly when f/n >= k%, at 1%, 29% (where 0.29 × 100 falls
// short of 29 in floating point), 99% and 100% alike, and a window of one
// trips on its first failure at any threshold.
func TestBreakerThresholdExactAtEveryPercent(t *testing.T) {
	for _, n := range []int{1, 3, 7, 20, 100} {
		for k := 1; k <= 100; k++ {
			for f := 0; f <= n; f++ {
				b, _ := newTestBreaker(t, BreakerConfig{Window: n, MinSamples: n, FailThreshold: float64(k) / 100})
				for i := range n {
					p, err := b.Acquire()
					if err != nil {
						t.Fatalf("window %d, %d%%: outcome %d refused before the window was full", n, k, i)
					}
					if i < n-f {
						p.Success()
					} else {
						p.Failure()
					}
				}
				want := Closed
				if f*100 >= k*n {
					want = Open
				}
				if got := b.State(); got != want {
					t.Errorf("window %d, threshold %d%%: %d failures of %d left the breaker %v, want %v", n, k, f, n, got, want)
				}
			}
		}
	}
}

// Half-open lets one probe through at a time, however many goroutines ask
// while the clock moves: here every probe ends in a failure (which
// re-opens the breaker, and its goroutine then moves the clock past the
// cool-off) or a Cancel (which frees its place at once), so after the first
// trip every permit is a probe, and no two may be out together. The clock
// moves only while no probe is out, so none is ever lost. It also never
// wedges: probes keep coming until the end.
func TestBreakerOneProbeAtATimeUnderConcurrency(t *testing.T) {
	b, clock := newTestBreaker(t, BreakerConfig{Window: 4, MinSamples: 1, CoolOff: time.Second})
	trip(t, b)
	clock.Advance(time.Second)
	const goroutines, probes = 8, 4000
	var out, given, failed atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := 0; given.Load() < probes && i < 10*probes; i++ {
				p, err := b.Acquire()
				if err != nil {
					continue
				}
				if n := out.Add(1); n > 1 {
					t.Errorf("%d probes out at once", n)
					return
				}
				given.Add(1)
				out.Add(-1) // before the probe ends: the next one can only come after
				if (i+g)%3 == 0 {
					failed.Add(1)
					p.Failure() // open again: this goroutine holds the only probe, so it alone moves the clock
					clock.Advance(time.Second)
				} else {
					p.Cancel()
				}
			}
		})
	}
	waitGroupWithin(t, &wg, time.Minute)
	if given.Load() < probes {
		t.Fatalf("only %d probes let through in %d tries per goroutine: the breaker wedged (state %v)", given.Load(), 10*probes, b.State())
	}
	if failed.Load() == 0 {
		t.Fatal("no probe failed: the test did not re-open the breaker")
	}
}
