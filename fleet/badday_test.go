package fleet

// Tests from an adversarial review: a fleet's bad day on Redis.

import (
	"context"
	"testing"
	"time"
)

// A crash loop whose outages outlast a membership's life: Redis dies, stays
// dead longer than membershipLife (a restart back-off), comes back empty
// and dies again while the three instances are still coming back to it one
// by one, seeing fleets of 1, 2 and 3. TestLocalSharesAfterRestartTakeTheLargestFleet
// holds for an outage of a second; here the outage is five, and the count
// from before it must still not be forgotten for one taken while the fleet
// was gathering: the time spent local told the instance nothing about the
// fleet's size.
func TestLocalSharesAfterLongOutageTakeTheLargestFleet(t *testing.T) {
	r := startRedis(t)
	const rate, n = 3000.0, 3
	localRate := make([]float64, n) // each instance's last local share
	limiters, _, step := steppedFleet(t, r, rate, n, func(i int, sw Switch) { localRate[i] = sw.Rate })

	r.kill()
	for range 5 { // dead for five seconds, checked once a second
		step()
	}
	r.restart()
	// go-redis stops dialling after two failed dials and probes once a
	// second of real time in the background: wait for each client's probe
	// (the manual clock stands still meanwhile).
	waitUntil(t, 5*time.Second, "each client to dial Redis again", func() bool {
		for _, l := range limiters {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := l.rdb.Ping(ctx).Err()
			cancel()
			if err != nil {
				return false
			}
		}
		return true
	})
	step() // each comes back in turn
	for i, l := range limiters {
		if l.Mode() != ModeShared {
			t.Fatalf("instance %d is %v after Redis came back", i, l.Mode())
		}
		t.Logf("instance %d came back and saw %d instances", i, l.Instances())
	}
	r.kill()
	step() // each sees Redis gone again

	var shares float64
	for i, l := range limiters {
		if l.Mode() != ModeLocal {
			t.Fatalf("instance %d is %v with Redis dead", i, l.Mode())
		}
		shares += localRate[i]
	}
	// Close's call to leave the fleet would fail a second dial, and go-redis
	// would probe in the background for a second after Close: Redis up again.
	r.restart()
	if shares > 1.001*rate {
		t.Errorf("with Redis dead again after a 5 s outage the local shares sum to %.0f/s = %.2f × the rate: taken from fleet counts seen while the fleet was gathering",
			shares, shares/rate)
	}
}

// Redis loses its keys between two calls (a restart quicker than a call, a
// failover to a replica that never had them, an eviction, a FLUSHALL): no
// call fails, so no instance leaves shared mode, and the next calls find no
// bucket. The README's bound holds over any span T: rate × T + burst + the
// leases in hand when it began, none from the fleet's first call. A new
// bucket that starts full hands the fleet a second burst inside the span.
func TestRedisEmptiedGivesNoSecondBurst(t *testing.T) {
	r := startRedis(t)
	c := r.client()
	const rate, burst, n = 3000.0, 3000, 3
	start := redisTime(t, c)
	f := startFleet(t, r, n, Config{Rate: rate, Burst: burst, Timeout: time.Second}, 3*rate/n)
	run := time.NewTimer(1500 * time.Millisecond) // the first burst spent: the bucket runs on its refill
	<-run.C
	if err := c.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	run.Reset(1500 * time.Millisecond)
	<-run.C
	f.stopLoad()
	elapsed := redisTime(t, c).Sub(start).Seconds()
	for i, l := range f.limiters {
		if l.Switches() != 0 || l.Mode() != ModeShared {
			t.Fatalf("instance %d left shared mode (%+v): the bound below is the shared bucket's", i, f.logs[i].all())
		}
	}
	total := f.total()
	bound := burst + rate*elapsed
	t.Logf("%d instances admitted %d in %.3f s of Redis time: %.2f × (burst + rate × time = %.0f)", n, total, elapsed, float64(total)/bound, bound)
	if float64(total) > bound {
		t.Errorf("the fleet admitted %d, over burst + rate × time = %.0f: Redis emptied under it gave a second burst", total, bound)
	}
}

// TestLeaseScriptLostBucket: an absent bucket is a full one to a caller
// that does not know of it, and an empty one to a caller whose last call
// found it less than bucketSure ago: Redis lost it.
func TestLeaseScriptLostBucket(t *testing.T) {
	r := startRedis(t)
	c := r.client()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, s := range []struct {
		key    string
		stands bool
		want   int64
	}{
		{"fresh", false, 5},
		{"lost", true, 0},
	} {
		got, err := callLease(ctx, c, fleetKeys(s.key), 1, 10, 5, "a", settlement{}, s.stands)
		if err != nil || got.granted != s.want {
			t.Errorf("%s bucket: %+v, %v; want %d granted", s.key, got, err, s.want)
		}
	}
}
