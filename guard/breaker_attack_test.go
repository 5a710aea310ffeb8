package guard

import (
	"testing"
	"time"
)

// Attack on the head comment's rule for a lost probe: "A probe that has not
// reported within CoolOff counts as failed". The deadline is only looked at
// by Acquire; a probe whose report comes after its CoolOff but before the
// next Acquire is taken as it reports. Its late Success closes the breaker,
// which the rule says counts as a failure and re-opens it.
func TestAttackProbeReportingAfterItsDeadlineCountsFailed(t *testing.T) {
	b, clock := newTestBreaker(t, BreakerConfig{MinSamples: 4, CoolOff: time.Second})
	trip(t, b)
	clock.Advance(time.Second)
	probe, err := b.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second) // twice its deadline; no other call came meanwhile
	probe.Success()
	if got := b.State(); got != Open {
		t.Fatalf("a probe reporting 2s after it went out, with a 1s deadline, moved the breaker to %v; "+
			"the head comment counts it as failed (open)", got)
	}
}

// A learner's reading of the head comment's lost-probe rule: "A probe that
// has not reported within CoolOff counts as failed", and record applies it
// "whether or not a call came in meanwhile to find it lost". Cancel does
// not: a probe cancelled after its deadline, with no call in between, frees
// its place and the next call probes at once, where the same Cancel after
// one refused call finds the breaker re-opened with a fresh cool-off. The
// verdict on a lost probe depends on whether some other call happened to
// arrive, which is what the rule says it must not.
func TestLearnerProbeCancelledAfterItsDeadlineCountsFailed(t *testing.T) {
	for _, callBetween := range []bool{true, false} {
		b, clock := newTestBreaker(t, BreakerConfig{MinSamples: 4, CoolOff: time.Second})
		trip(t, b)
		clock.Advance(time.Second)
		probe, err := b.Acquire()
		if err != nil {
			t.Fatal(err)
		}
		clock.Advance(2 * time.Second) // twice the probe's deadline: lost
		if callBetween {
			_ = b.Allow() // finds the probe lost: open, cool-off restarted
		}
		probe.Cancel()
		_, err = b.Acquire()
		if s := b.State(); s != Open || err == nil {
			t.Errorf("a call in between: %v; after the lost probe's late Cancel: state %v, Acquire = %v; "+
				"want open and ErrOpen (a probe silent past CoolOff counts as failed)", callBetween, s, err)
		}
	}
}
