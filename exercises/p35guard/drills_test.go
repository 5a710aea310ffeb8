package p35guard

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"dnsproxi/guard"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Exercise 1 (predict): rate=10, burst=5, idle for 1 s — how many queries pass in a row?
// Answer: 5. One idle second earns 10 tokens, but the bucket holds at most burst=5.
func TestExercise1BurstCap(t *testing.T) {
	clock := guard.NewManualClock(t0)
	b := guard.NewTokenBucket(10, 5, clock)
	clock.Advance(time.Second)
	inARow := 0
	for b.Allow(1) {
		inARow++
		if inARow > 100 {
			t.Fatal("the bucket never ran dry")
		}
	}
	if inARow != 5 {
		t.Fatalf("%d in a row, want 5 (the burst caps what idling earns)", inARow)
	}
}

// Exercise 2 (predict): MinSamples=20, threshold 50% — do 19 straight failures open the breaker?
// Answer: no. Below MinSamples the ratio is not trusted; the 20th failure opens it.
func TestExercise2TooFewSamples(t *testing.T) {
	b := guard.NewBreaker(guard.BreakerConfig{MinSamples: 20, FailThreshold: 0.5}, guard.NewManualClock(t0))
	for range 19 {
		if err := b.Allow(); err != nil {
			t.Fatalf("refused before the 20th sample: %v", err)
		}
		b.MarkFailure()
	}
	if b.State() != guard.Closed {
		t.Fatalf("19 failures: %v, want closed", b.State())
	}
	_ = b.Allow()
	b.MarkFailure()
	if b.State() != guard.Open {
		t.Fatalf("20 failures: %v, want open", b.State())
	}
}

// Exercise 3 (observe): wait 200 ms on the manual clock, then 200 ms on the real one.
// Answer: the manual clock's timer fires the moment Advance(200ms) is called, in next to
// no real time; the real clock's timer fires after 200 ms of real time. That is why every
// guard test runs on the manual clock. Both are the timers a waiting Take sleeps on.
func TestExercise3ManualVersusReal(t *testing.T) {
	const d = 200 * time.Millisecond
	clock := guard.NewManualClock(t0)
	start := time.Now()
	fired := clock.After(d)
	clock.Advance(d)
	select {
	case at := <-fired:
		if got := at.Sub(t0); got != d {
			t.Fatalf("the manual timer fired at %v of clock time, want %v", got, d)
		}
	default:
		t.Fatal("Advance(200ms) did not fire a 200 ms manual timer")
	}
	manualReal := time.Since(start)

	start = time.Now()
	select {
	case <-guard.RealClock{}.After(d):
		if got := time.Since(start); got < d {
			t.Fatalf("the real timer fired after %v, before its %v", got, d)
		}
	case <-time.After(10 * time.Second): // a safety net, not the wait
		t.Fatal("a 200 ms real timer did not fire within 10 s")
	}
	t.Logf("a 200 ms timer: %v of real time on the manual clock, %v on the real clock", manualReal, time.Since(start))
}

// Exercise 4 (extend): Take(ctx) blocks until one token is there.
// Answer: with an empty bucket at 10/s, Take returns after exactly 100 ms of clock time
// and not a nanosecond before.
func TestExercise4TakeBlocks(t *testing.T) {
	clock := guard.NewManualClock(t0)
	b := guard.NewTokenBucket(10, 1, clock)
	if !b.Allow(1) {
		t.Fatal("a new bucket should start full")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a safety net
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- b.Take(ctx) }()
	if err := clock.BlockUntilWaiters(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(100*time.Millisecond - time.Nanosecond)
	// Take's timer must still be pending. Looking at done would not do: a
	// timer fired by Advance returns Take on its own goroutine, later. The
	// count of waiters is exact now: asked with a context already ended,
	// BlockUntilWaiters answers from the count it sees.
	now, stop := context.WithCancel(ctx)
	stop()
	if clock.BlockUntilWaiters(now, 1) != nil {
		t.Fatal("Take's timer fired before a token was earned")
	}
	clock.Advance(time.Nanosecond)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("Take still blocked after the token was earned")
	}
}

// Exercise 5 (extend): OnStateChange — what does the callback get when half-open closes?
// Answer: from=HalfOpen, to=Closed, and State() inside the callback already says Closed.
func TestExercise5CallbackOnClose(t *testing.T) {
	clock := guard.NewManualClock(t0)
	b := guard.NewBreaker(guard.BreakerConfig{MinSamples: 1, CoolOff: time.Second}, clock)
	type change struct{ from, to, seen guard.State }
	var changes []change
	b.OnStateChange(func(from, to guard.State) { changes = append(changes, change{from, to, b.State()}) })
	_ = b.Allow()
	b.MarkFailure() // closed → open
	clock.Advance(time.Second)
	_ = b.Allow()   // open → half-open: the probe
	b.MarkSuccess() // half-open → closed
	if len(changes) != 3 {
		t.Fatalf("%d transitions, want 3: %v", len(changes), changes)
	}
	if got, want := changes[2], (change{guard.HalfOpen, guard.Closed, guard.Closed}); got != want {
		t.Fatalf("closing callback got %+v, want %+v", got, want)
	}
}

// Exercise 6 (benchmark): recording outcomes from every core vs Allow on one.
// Run: go test -bench Exercise6 ./exercises/p35guard/
// Answer: Allow on a closed breaker takes no lock and reads no clock (one atomic load:
// a few nanoseconds). Recording an outcome takes the breaker's one mutex; under
// RunParallel that lock is contended, so ns/op does not halve on two cores: the lock,
// not the ring's arithmetic, is the cost. The recording breaker gets a failure and a
// success each time, so at FailThreshold 1 its window never holds only failures and it
// stays closed: an open breaker records nothing, and would measure nothing.
// (One success followed by failures only is not enough: the window forgets it at the
// Window-th failure, and the breaker trips; TestExercise6BreakerStaysClosed.)
func BenchmarkExercise6(b *testing.B) {
	b.Run("Allow", func(b *testing.B) {
		br := guard.NewBreaker(guard.BreakerConfig{}, guard.RealClock{})
		b.ReportAllocs()
		for b.Loop() {
			_ = br.Allow()
		}
	})
	b.Run("MarkFailure+MarkSuccess-parallel", func(b *testing.B) {
		br := guard.NewBreaker(guard.BreakerConfig{FailThreshold: 1}, guard.RealClock{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				br.MarkFailure()
				br.MarkSuccess()
			}
		})
		if s := br.State(); s != guard.Closed {
			b.Fatalf("the breaker measured is %v: it recorded nothing", s)
		}
	})
}

// Exercise 7 (experiment): 100 replicas, each with its own breaker, call one shared
// upstream every 100 ms of simulated time. When does each replica trip, with a
// threshold of 50% and of 100%?
// Answer: in a total outage both thresholds trip every replica at the 20th call (2 s,
// MinSamples). In a brownout where 70% of calls fail, 50% still trips every replica at the
// 20th call, while 100% never trips: a 100% breaker protects only against a total outage.
func TestExercise7Replicas(t *testing.T) {
	const replicas, calls = 100, 300 // 30 s of simulated time per replica
	tests := []struct {
		name       string
		failPer10  int // the upstream fails this many calls in every 10
		threshold  float64
		wantTripAt time.Duration // every replica trips then, at its 20th call (MinSamples), not before; 0: none trips
	}{
		{"outage, 50%", 10, 0.5, 2 * time.Second},
		{"outage, 100%", 10, 1.0, 2 * time.Second},
		{"brownout 70%, 50%", 7, 0.5, 2 * time.Second},
		{"brownout 70%, 100%", 7, 1.0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := sharedUpstream{failPer10: tt.failPer10}
			trips := make(chan time.Duration, replicas) // -1: never tripped
			for r := range replicas {
				go func() { trips <- runReplica(r, up, tt.threshold, calls) }()
			}
			tripped, earliest, latest := 0, time.Duration(math.MaxInt64), time.Duration(0)
			for range replicas {
				at := <-trips
				if at >= 0 {
					tripped++
					earliest, latest = min(earliest, at), max(latest, at)
				}
			}
			t.Logf("%s: %d of %d replicas tripped, between %v and %v of simulated time", tt.name, tripped, replicas, earliest, latest)
			switch {
			case tt.wantTripAt == 0 && tripped != 0:
				t.Fatalf("%d replicas tripped, want none", tripped)
			case tt.wantTripAt > 0 && (tripped != replicas || earliest != tt.wantTripAt || latest != tt.wantTripAt):
				t.Fatalf("%d replicas tripped, between %v and %v, want all %d at %v", tripped, earliest, latest, replicas, tt.wantTripAt)
			}
		})
	}
}

// sharedUpstream fails a fixed share of calls. Whether call seq of replica r
// fails is fixed, so every run of the experiment sees the same upstream.
type sharedUpstream struct{ failPer10 int }

var errUpstream = errors.New("upstream failed")

func (u sharedUpstream) call(replica, seq int) error {
	if (seq*7+replica*3)%10 < u.failPer10 {
		return errUpstream
	}
	return nil
}

// runReplica calls the upstream every 100 ms of its own simulated time and
// returns when its breaker first opened, or -1.
func runReplica(id int, up sharedUpstream, threshold float64, calls int) time.Duration {
	clock := guard.NewManualClock(t0)
	b := guard.NewBreaker(guard.BreakerConfig{MinSamples: 20, FailThreshold: threshold}, clock)
	for seq := range calls {
		clock.Advance(100 * time.Millisecond)
		if b.Allow() != nil {
			continue
		}
		if err := up.call(id, seq); err != nil {
			b.MarkFailure()
		} else {
			b.MarkSuccess()
		}
		if b.State() == guard.Open {
			return clock.Now().Sub(t0)
		}
	}
	return -1
}
