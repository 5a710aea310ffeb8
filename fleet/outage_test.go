package fleet

import (
	"errors"
	"syscall"
	"testing"
	"time"
)

// TestFleetRedisKilled: three instances in shared mode, each offered three
// times its third; Redis is killed. Each switches once to a local bucket of
// a third of the rate, and while Redis is dead the fleet admits at most
// 1.1 × the rate. Redis restarted (empty), each returns to shared mode, and
// over the whole run the fleet stays within the stated bound: rate × time,
// plus a burst from each full bucket it met (the first, and the restarted
// Redis's), plus what leases can add (rate × 1 s).
func TestFleetRedisKilled(t *testing.T) {
	r := startRedis(t)
	const rate, burst, n = 3000.0, 300, 3
	start := time.Now()
	// Redis alive or dead, never slow: the timeout is long, so that a call
	// slowed by a loaded machine (-race on two cores) is no switch the kill
	// did not cause (at the default 50 ms one was: "switched 3 times").
	f := startFleet(t, r, n, Config{Rate: rate, Burst: burst, Timeout: 2 * time.Second}, 3*rate/n)
	waitUntil(t, 5*time.Second, "the fleet to see three instances", func() bool {
		for _, l := range f.limiters {
			if l.Instances() != n {
				return false
			}
		}
		return true
	})
	for i, l := range f.limiters {
		if l.Mode() != ModeShared || l.Switches() != 0 {
			t.Fatalf("instance %d in %v after %d switches before Redis was killed: %+v", i, l.Mode(), l.Switches(), f.logs[i].all())
		}
	}

	r.kill()
	for i, log := range f.logs {
		sw := log.waitFor(t, ModeLocal, 1, 5*time.Second)
		if sw.From != ModeShared || sw.Instances != n || sw.Rate != rate/n || !errors.Is(sw.Err, ErrRedis) {
			t.Errorf("instance %d: %+v, want shared → local at %v/s with %d instances and an ErrRedis", i, sw, rate/n, n)
		}
	}
	localFrom := f.total()
	localStart := time.Now()
	// One second of local mode, measured by the instances' own checks: each
	// makes one failed call a second, so two more failures each mean at
	// least a second has passed.
	calls := make([]uint64, n)
	for i, l := range f.limiters {
		calls[i] = l.RedisCalls().Error + l.RedisCalls().Timeout
	}
	waitUntil(t, 10*time.Second, "two failed checks per instance", func() bool {
		for i, l := range f.limiters {
			if l.RedisCalls().Error+l.RedisCalls().Timeout < calls[i]+2 {
				return false
			}
		}
		return true
	})
	localAdmitted, localTime := f.total()-localFrom, time.Since(localStart).Seconds()
	t.Logf("local mode: %d admitted in %.2f s: %.0f/s against the fleet's %v/s", localAdmitted, localTime, float64(localAdmitted)/localTime, rate)

	r.restart()
	for i, log := range f.logs {
		sw := log.waitFor(t, ModeShared, 2, 10*time.Second)
		if sw.From != ModeLocal || sw.Err != nil {
			t.Errorf("instance %d: %+v, want local → shared", i, sw)
		}
		if got := f.limiters[i].Switches(); got != 2 {
			t.Errorf("instance %d switched %d times, want 2: %+v", i, got, log.all())
		}
	}
	f.stopLoad()
	total, elapsed := f.total(), time.Since(start).Seconds()
	t.Logf("whole run: %d admitted in %.2f s: %.3f × rate × time", total, elapsed, float64(total)/(rate*elapsed))
	if float64(localAdmitted) > 1.1*rate*localTime {
		t.Errorf("with Redis dead the fleet admitted %d in %.2f s, over 1.1 × rate × time = %.0f", localAdmitted, localTime, 1.1*rate*localTime)
	}
	if bound := rate*elapsed + 2*burst + rate*1; float64(total) > bound {
		t.Errorf("the fleet admitted %d in %.2f s, over rate × time + 2 bursts + rate × 1 s = %.0f", total, elapsed, bound)
	}
	if float64(localAdmitted) < 0.5*rate*localTime {
		t.Errorf("in local mode the fleet admitted %d in %.2f s, under half the rate: the shares refuse too much", localAdmitted, localTime)
	}
}

// TestFleetRedisStopped: Redis stopped (SIGSTOP: connections accepted,
// nothing answered). Allow keeps returning while a call to Redis hangs;
// the call times out and each instance switches to its share; Redis
// continued, shared mode returns.
func TestFleetRedisStopped(t *testing.T) {
	r := startRedis(t)
	const rate, n = 3000.0, 2
	f := startFleet(t, r, n, Config{Rate: rate}, 3*rate/n)
	waitUntil(t, 5*time.Second, "the fleet to see two instances", func() bool {
		return f.limiters[0].Instances() == n && f.limiters[1].Instances() == n
	})
	r.signal(syscall.SIGSTOP)
	defer r.signal(syscall.SIGCONT)

	// A call is in flight when more have begun than ended; if the count of
	// ended calls has not moved across the loop, that call hung throughout,
	// and every Allow in the loop returned while it did.
	l := f.limiters[0]
	proven := false
	for try := 0; try < 20 && !proven; try++ {
		var began, ended uint64
		waitUntil(t, 5*time.Second, "a call to the stopped Redis", func() bool {
			ended = l.callsMade()
			began = l.begun.Load()
			return began > ended
		})
		for range 10_000 {
			l.Allow(1)
		}
		proven = l.callsMade() == ended && l.begun.Load() == began
	}
	if !proven {
		t.Fatal("in 20 tries, no call to the stopped Redis outlasted 10,000 calls of Allow")
	}

	for i, log := range f.logs {
		sw := log.waitFor(t, ModeLocal, 1, 5*time.Second)
		if sw.Instances != n || sw.Rate != rate/n || !errors.Is(sw.Err, ErrRedis) {
			t.Errorf("instance %d: %+v, want local at %v/s and an ErrRedis", i, sw, rate/n)
		}
		if f.limiters[i].RedisCalls().Timeout == 0 {
			t.Errorf("instance %d: calls %+v, want a timeout", i, f.limiters[i].RedisCalls())
		}
	}
	r.signal(syscall.SIGCONT)
	for i, log := range f.logs {
		if sw := log.waitFor(t, ModeShared, 2, 10*time.Second); sw.From != ModeLocal {
			t.Errorf("instance %d: %+v, want local → shared", i, sw)
		}
	}
}
