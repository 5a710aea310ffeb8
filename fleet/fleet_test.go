package fleet

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fleetRun is n limiters on one Redis, each offered a steady load by its
// own goroutine; the admitted tokens are counted per instance.
type fleetRun struct {
	limiters []*Limiter
	logs     []*switchLog
	admitted []atomic.Int64
	stop     chan struct{}
	wg       sync.WaitGroup
}

// startFleet builds n limiters on r with cfg and offers each perSecond
// tokens a second, one at a time, until stopLoad.
func startFleet(t *testing.T, r *redisServer, n int, cfg Config, perSecond float64) *fleetRun {
	t.Helper()
	f := &fleetRun{admitted: make([]atomic.Int64, n), stop: make(chan struct{})}
	for range n {
		log := newSwitchLog()
		c := cfg
		c.URL, c.OnSwitch = r.url(), log.record
		l, err := New(c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		f.limiters, f.logs = append(f.limiters, l), append(f.logs, log)
	}
	for i, l := range f.limiters {
		f.wg.Go(func() { offer(l, perSecond, &f.admitted[i], f.stop) })
	}
	t.Cleanup(f.stopLoad)
	return f
}

// offer calls l.Allow(1) perSecond times a second, catching up after a late
// tick, until stop is closed (bounded by the caller's run).
func offer(l *Limiter, perSecond float64, admitted *atomic.Int64, stop <-chan struct{}) {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	var offered int64
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			due := int64(now.Sub(start).Seconds() * perSecond)
			for ; offered < due; offered++ {
				if l.Allow(1) {
					admitted.Add(1)
				}
			}
		}
	}
}

// stopLoad ends the load and waits for the offering goroutines.
func (f *fleetRun) stopLoad() {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	f.wg.Wait()
}

// total is every instance's admitted tokens.
func (f *fleetRun) total() int64 {
	var sum int64
	for i := range f.admitted {
		sum += f.admitted[i].Load()
	}
	return sum
}

// TestFleetSharesTheRate: three instances on one Redis, each offered three
// times its third of the rate. Over the run, the fleet admits at most what
// the shared bucket holds and earns on Redis's clock (burst + rate × time),
// and not much less: the leases do not starve it.
func TestFleetSharesTheRate(t *testing.T) {
	r := startRedis(t)
	const rate, burst, n = 3000.0, 300, 3
	start := redisTime(t, r.client())
	f := startFleet(t, r, n, Config{Rate: rate, Burst: burst, Timeout: time.Second}, 3*rate/n)
	run := time.NewTimer(3 * time.Second) // the load's length: what is measured is counted against it
	<-run.C
	f.stopLoad()
	end := redisTime(t, r.client())
	elapsed := end.Sub(start).Seconds()
	total := f.total()
	bound := burst + rate*elapsed
	t.Logf("%d instances admitted %d in %.3f s of Redis time: %.1f%% of burst + rate × time (%.0f)",
		n, total, elapsed, 100*float64(total)/bound, bound)
	for i, l := range f.limiters {
		if l.Switches() != 0 || l.Mode() != ModeShared {
			t.Fatalf("instance %d left shared mode (%+v): the bound below holds for the shared bucket", i, f.logs[i].all())
		}
		if l.Instances() != n {
			t.Errorf("instance %d sees %d instances, want %d", i, l.Instances(), n)
		}
		t.Logf("instance %d: admitted %d, %+v", i, f.admitted[i].Load(), l.RedisCalls())
	}
	if float64(total) > bound {
		t.Errorf("the fleet admitted %d, more than burst + rate × time = %.0f", total, bound)
	}
	for i := range f.admitted {
		if got := f.admitted[i].Load(); got < total/5 {
			t.Errorf("instance %d admitted %d of %d: a third would be fair, under a fifth is starved", i, got, total)
		}
	}
	if float64(total) < 0.9*rate*elapsed {
		t.Errorf("the fleet admitted %d, under 90%% of rate × time (%.0f): the leases starve it", total, rate*elapsed)
	}
}
