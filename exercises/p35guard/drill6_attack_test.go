package p35guard

import (
	"testing"

	"dnsproxi/guard"
)

// Attack on drill 6's premise: "one success: 100% can never be reached, so
// it never trips". The breaker judges the last Window outcomes (100 by
// default), so the 100th failure pushes the one success out of the ring and
// 100 of 100 reach the threshold: the breaker opens, and from then on the
// benchmark's MarkFailure measures an open breaker that records nothing, not
// the closed path it says it measures.
func TestAttackDrill6BreakerWithOneSuccessNeverTrips(t *testing.T) {
	br := guard.NewBreaker(guard.BreakerConfig{FailThreshold: 1}, guard.NewManualClock(t0))
	br.MarkSuccess()
	for i := range 1000 {
		br.MarkFailure()
		if s := br.State(); s != guard.Closed {
			t.Fatalf("after one success and %d failures the breaker is %v: the drill says it never trips", i+1, s)
		}
	}
}
