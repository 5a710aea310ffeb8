//go:build knowndefects

package fleet

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Known defects, found by review and not yet fixed (README, the outbound
// limit): these fail until they are. Run them with
// go test -tags knowndefects ./fleet/.

// TestAttackIdleReservesStarveTheBusyInstance: at a low fleet rate the
// reserve is clamped up to 1 token, so each idle instance keeps leasing a
// token, lets it expire unspent 900 ms later and leases the next: the
// README's "the fleet's idle reserves together take at most reserveSpan of
// the rate per lease, about 1.25% of it" becomes about 1.1 tokens a second
// per idle instance. Seven instances share 5/s; six are idle, one is
// offered 2/s (40% of the contract, and the only traffic of the fleet). It
// should send all of it.
func TestAttackIdleReservesStarveTheBusyInstance(t *testing.T) {
	r := startRedis(t, "--port", "27621")
	url := "redis://127.0.0.1:27621/0"
	const rate, offered, run = 5.0, 2.0, 6 * time.Second
	var ls []*Limiter
	for range 7 {
		l, err := New(Config{URL: url, Rate: rate})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		ls = append(ls, l)
	}
	_ = r
	var admitted atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { offer(ls[0], offered, &admitted, stop) })
	time.Sleep(run) // the span the load runs; the wait is the measurement
	close(stop)
	wg.Wait()
	want := int64(offered * run.Seconds())
	for i, l := range ls {
		t.Logf("admitted %d; instance %d: mode %v, instances %d, lease %d, calls %+v", admitted.Load(), i, l.Mode(), l.Instances(), l.LeaseTokens(), l.RedisCalls())
	}
	if got := admitted.Load(); got < want*9/10 {
		t.Errorf("the busy instance sent %d of %d queries offered at %.0f/s, with the fleet's contract at %.0f/s and nobody else sending: %d refused",
			got, want, offered, rate, want-got)
	}
}

// TestAttackLoneInstanceBelowOneTokenASecondRefused: with a refill slower
// than a lease's life (rate below about 1.1/s; the range goes down to
// 0.001), a lone idle instance leases the bucket's one token as its
// reserve, lets it expire unspent after 900 ms, and the bucket is empty
// until the next refill: for about 1.1 s of every 2 the instance holds
// nothing, and a query then is refused though the instance has sent
// nothing for seconds. A local bucket of the same rate, idle, holds its
// token all the time. Rate 0.5/s, burst 1: after 2.5 s idle, the lease is
// watched every 50 ms for 4 s; the first time it is empty, one query is
// asked for.
func TestAttackLoneInstanceBelowOneTokenASecondRefused(t *testing.T) {
	startRedis(t, "--port", "27641")
	l, err := New(Config{URL: "redis://127.0.0.1:27641/0", Rate: 0.5, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	time.Sleep(2500 * time.Millisecond) // idle: a local bucket would be full by now
	var seen strings.Builder
	empty := 0
	for range 80 {
		time.Sleep(50 * time.Millisecond)
		held := l.LeaseTokens()
		fmt.Fprint(&seen, held)
		if held == 0 {
			empty++
			if empty == 1 && !l.Allow(1) {
				t.Errorf("a query after 2.5 s of idle refused, mode %v, calls %+v", l.Mode(), l.RedisCalls())
			}
		}
	}
	if empty > 0 {
		t.Errorf("idle at 0.5/s, the lone instance held no token at %d of 80 looks 50 ms apart (%s); %d Redis calls in 6.5 s",
			empty, seen.String(), l.begun.Load())
	}
}
