package guard

import (
	"math"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Attack on both-or-neither through the paths the existing tests leave at
// a stopped clock: a table of 8 slots, 256 prefixes, and time moving, so
// that buckets refill, full ones are evicted under the shard's lock while
// checks race on them, busy groups send prefixes to the overflow bucket,
// and readings arrive out of order (each goroutine reads the clock, then
// asks). The shared bucket barely refills (0.001/s), so every shared token
// is accounted for: what it lost is what was admitted, to within what it
// earned.
func TestAttackAllowWithAtConservesSharedTokensAcrossEvictions(t *testing.T) {
	const goroutines, asks, sharedBurst = 8, 4000, 12000
	for round := range 5 {
		clock := NewManualClock(t0)
		l := newClientLimiter(ClientLimiterConfig{Rate: 1000, Burst: 3, TableSize: 8}, clock, 1, clientWays)
		shared := NewTokenBucket(0.001, sharedBurst, clock)
		var admitted, byClient, byShared atomic.Int64
		var wg sync.WaitGroup
		stop := make(chan struct{})
		var ticker sync.WaitGroup
		ticker.Add(1)
		go func() { // time moves while the checks run: 10 µs a step, 3 ms a bucket's refill
			defer ticker.Done()
			for i := 0; i < 1_000_000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				clock.Advance(10 * time.Microsecond)
			}
		}()
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range asks {
					addr := netip.AddrFrom4([4]byte{127, 2, byte(g), byte(i * 7 % 32)})
					switch l.AllowWithAt(clock.Now(), addr, shared) {
					case Admitted:
						admitted.Add(1)
					case RefusedByClient:
						byClient.Add(1)
					case RefusedByShared:
						byShared.Add(1)
					}
				}
			}()
		}
		waitGroupWithin(t, &wg, time.Minute)
		close(stop)
		waitGroupWithin(t, &ticker, time.Minute)
		elapsed := clock.Now().Sub(t0).Seconds()
		got, want := shared.Tokens(), math.Min(sharedBurst-float64(admitted.Load())+0.001*elapsed, sharedBurst)
		t.Logf("round %d: admitted %d, client %d, shared %d; evictions %d, overflows %d; %.3f s", round, admitted.Load(), byClient.Load(), byShared.Load(), l.Evictions(), l.Overflows(), elapsed)
		if admitted.Load() > sharedBurst+int64(0.001*elapsed)+1 {
			t.Fatalf("round %d: %d admitted, the shared bucket holds %d and earned %.3f", round, admitted.Load(), sharedBurst, 0.001*elapsed)
		}
		if math.Abs(got-want) > 0.01 {
			t.Fatalf("round %d: the shared bucket holds %v after %d admitted, want %v: a shared token lost or minted", round, got, admitted.Load(), want)
		}
	}
}
