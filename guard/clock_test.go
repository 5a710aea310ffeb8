package guard

import (
	"testing"
	"time"
)

// ManualClock.After: a timer fires when the clock reaches its deadline, not
// before; one with d <= 0 has fired when After returns; a clock set back
// fires nothing.
func TestManualClockAfter(t *testing.T) {
	fired := func(ch <-chan time.Time) (time.Time, bool) {
		select { // exact: ManualClock sends under its lock, before After, Advance or Set returns
		case at := <-ch:
			return at, true
		default:
			return time.Time{}, false
		}
	}
	for _, d := range []time.Duration{0, -time.Second} {
		c := NewManualClock(t0)
		if at, ok := fired(c.After(d)); !ok || !at.Equal(t0) {
			t.Errorf("After(%v) = %v, fired %v; want it fired at once with the clock's reading", d, at, ok)
		}
	}
	c := NewManualClock(t0)
	ch := c.After(time.Second)
	c.Advance(time.Second - time.Nanosecond)
	if _, ok := fired(ch); ok {
		t.Fatal("a 1 s timer fired 1 ns early")
	}
	c.Set(t0.Add(-time.Hour))
	if _, ok := fired(ch); ok {
		t.Fatal("a clock set back an hour fired a timer")
	}
	c.Set(t0.Add(time.Second))
	if at, ok := fired(ch); !ok || !at.Equal(t0.Add(time.Second)) {
		t.Fatalf("at its deadline the timer fired %v at %v, want it fired at t0+1s", ok, at)
	}
}
