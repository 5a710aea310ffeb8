package fleet

// Tests from an adversarial review: a fleet's bad day on Redis.

import (
	"context"
	"testing"
	"time"

	"dnsproxi/guard"
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
	clock := guard.NewManualClock(time.Unix(1_700_000_000, 0))
	var limiters []*Limiter
	localRate := make([]float64, n) // each instance's last local share
	for i := range n {
		l, err := newLimiter(Config{URL: r.url(), Rate: rate, Timeout: 2 * time.Second, Clock: clock,
			OnSwitch: func(sw Switch) { localRate[i] = sw.Rate }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			close(l.done) // no goroutine to close it
			l.Close()
		})
		limiters = append(limiters, l)
	}
	step := func() {
		clock.Advance(checkInterval)
		for _, l := range limiters {
			l.step(clock.Now())
		}
	}
	step()
	for i, l := range limiters {
		if l.Mode() != ModeShared || l.Instances() != n {
			t.Fatalf("instance %d: mode %v, %d instances; want shared with %d", i, l.Mode(), l.Instances(), n)
		}
	}

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
