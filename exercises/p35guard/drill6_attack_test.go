package p35guard

import (
	"testing"

	"dnsproxi/guard"
)

// Drill 6's premise: the breaker it measures stays closed. The drill once
// gave it one success and then failures only, saying 100% could never be
// reached; but the breaker judges the last Window outcomes (100 by default),
// so the 100th failure pushed the success out and the breaker opened, and the
// benchmark measured an open breaker that records nothing. A failure and a
// success each time keep it closed; one success and failures alone do not.
func TestExercise6BreakerStaysClosed(t *testing.T) {
	br := guard.NewBreaker(guard.BreakerConfig{FailThreshold: 1}, guard.NewManualClock(t0))
	for i := range 1000 {
		br.MarkFailure()
		br.MarkSuccess()
		if s := br.State(); s != guard.Closed {
			t.Fatalf("after %d failures and successes in turn the breaker is %v", i+1, s)
		}
	}
	once := guard.NewBreaker(guard.BreakerConfig{FailThreshold: 1}, guard.NewManualClock(t0))
	once.MarkSuccess()
	for range 100 {
		once.MarkFailure()
	}
	if s := once.State(); s != guard.Open {
		t.Fatalf("one success then 100 failures: the breaker is %v, want open (the window forgot the success)", s)
	}
}
