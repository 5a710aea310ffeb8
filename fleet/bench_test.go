package fleet

import (
	"context"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"dnsproxi/guard"
)

// leaseInHand is a limiter holding more tokens than any run spends, with no
// goroutine and no Redis: Allow's path with a lease in hand, alone.
func leaseInHand() *Limiter {
	l := &Limiter{wake: make(chan struct{}, 1)}
	l.lease.tokens.Store(math.MaxInt64 / 2)
	return l
}

// localOnly is a limiter in local mode with an empty lease: Allow's path
// through the local bucket, which never runs dry here.
func localOnly() *Limiter {
	l := &Limiter{wake: make(chan struct{}, 1)}
	l.asking.Store(true) // as in local mode between checks
	l.local.Store(guard.NewTokenBucket(1e12, math.MaxInt32, guard.RealClock{}))
	return l
}

// TestAllowDoesNotAllocate counts every allocation in 10,000 calls of Allow,
// on the lease and through the local bucket.
func TestAllowDoesNotAllocate(t *testing.T) {
	cases := []struct {
		name string
		l    *Limiter
	}{
		{"lease in hand", leaseInHand()},
		{"local bucket", localOnly()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if allocs := testing.AllocsPerRun(10_000, func() {
				if !c.l.Allow(1) {
					t.Fatal("refused")
				}
			}); allocs != 0 {
				t.Errorf("%v allocations per Allow, want 0", allocs)
			}
		})
	}
}

// BenchmarkAllow compares Allow with a lease in hand to guard.TokenBucket's
// Allow (the local limit), serial and parallel, in one run.
func BenchmarkAllow(b *testing.B) {
	bucket := func() *guard.TokenBucket { return guard.NewTokenBucket(1e12, math.MaxInt32, guard.RealClock{}) }
	cases := []struct {
		name  string
		allow func(int) bool
	}{
		{"fleet-lease", leaseInHand().Allow},
		{"fleet-local", localOnly().Allow},
		{"guard-TokenBucket", bucket().Allow},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.allow(1)
			}
		})
		b.Run(c.name+"-parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c.allow(1)
				}
			})
		})
	}
}

// BenchmarkAllowRedis is the whole limiter on a real Redis whose rate is far
// above the load: the lease refilled by the goroutine while Allow runs.
func BenchmarkAllowRedis(b *testing.B) {
	r := startRedis(b)
	l, err := New(Config{URL: r.url(), Rate: 1e9, Burst: 1e9, Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	var admitted, offered atomic.Int64
	b.ReportAllocs()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var yes, all int64
		for pb.Next() {
			all++
			if l.Allow(1) {
				yes++
			}
		}
		admitted.Add(yes)
		offered.Add(all)
	})
	b.ReportMetric(float64(l.callsMade())/time.Since(start).Seconds(), "redis-calls/s")
	b.ReportMetric(100*float64(admitted.Load())/float64(max(offered.Load(), 1)), "admitted-%")
}

// BenchmarkLeaseScript is one call of the script on a Redis on loopback, the
// round trip included: without a ledger key (the ledger skipped), and with
// one holding totals (read, settled and written back each call). It
// reports Redis's own time per call too (INFO commandstats), which the
// round trip's noise does not reach.
func BenchmarkLeaseScript(b *testing.B) {
	r := startRedis(b)
	c := r.client()
	for _, bb := range []struct {
		name string
		keys []string
	}{
		{"no ledger", fleetKeys("bench")},
		{"ledger", callKeys("bench", "a")},
	} {
		b.Run(bb.name, func(b *testing.B) {
			ctx := context.Background()
			st := settlement{}
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				st.add(1, 1)
				if _, err := callLease(ctx, c, bb.keys, 1e9, 1e9, 1, "a", st, false); err != nil {
					b.Fatal(err)
				}
				st.debt, st.returned = 0, 0
			}
			b.ReportMetric(redisMicrosPerScript(b, c), "redis-µs/call")
		})
	}
}

// redisMicrosPerScript is the server's own time per EVALSHA since its
// statistics were last reset.
func redisMicrosPerScript(b *testing.B, c *redis.Client) float64 {
	b.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for _, field := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(field, "usec_per_call="); ok {
				us, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatal(err)
				}
				return us
			}
		}
	}
	b.Fatal("INFO commandstats has no evalsha line")
	return 0
}
