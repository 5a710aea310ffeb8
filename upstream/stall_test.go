package upstream

import (
	"testing"
	"time"
)

// stallTick is how often the stall meter looks at the clock.
const stallTick = 5 * time.Millisecond

// meterStalls measures, from now until the returned function is called, the
// longest the test's process went unscheduled: the most a goroutine of its
// own, waking every stallTick, woke late. On a loaded machine the whole
// process may stall for hundreds of milliseconds, and everything in it is
// late by as much; a bound on the code's own lateness allows for that, and
// for nothing more. The returned function stops the meter and reports.
func meterStalls(t *testing.T) func() time.Duration {
	t.Helper()
	stop, worst := make(chan struct{}), make(chan time.Duration, 1)
	go func() {
		tk := time.NewTicker(stallTick)
		defer tk.Stop()
		var most time.Duration
		last := time.Now()
		for {
			select {
			case <-stop:
				worst <- max(most, time.Since(last)-stallTick)
				return
			case <-tk.C:
			}
			now := time.Now()
			most = max(most, now.Sub(last)-stallTick)
			last = now
		}
	}()
	var stopped bool
	finish := func() time.Duration {
		if !stopped {
			stopped = true
			close(stop)
		}
		return <-worst
	}
	t.Cleanup(func() {
		if !stopped {
			finish()
		}
	})
	return finish
}
