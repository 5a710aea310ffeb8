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
func TestAttackProbeReportingAfterItsDeadlineIsNotCountedFailed(t *testing.T) {
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
