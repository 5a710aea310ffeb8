package guard

import (
	"math"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// refTable is the table of the commit before the lock-free one, written
// plainly: the same shards and groups (by fingerprint), the same placement,
// eviction and overflow rules, everything under one goroutine.
type refTable struct {
	l         *ClientLimiter // for keyOf, shardOf, groupsOf, admit
	shards    [][]refSlot
	floors    []int64
	overflow  int64
	size      int
	evictions uint64
	overflows uint64
}

type refSlot struct {
	fp  uint64
	tat int64
}

func newRefTable(l *ClientLimiter) *refTable {
	r := &refTable{l: l, shards: make([][]refSlot, len(l.shards)), floors: make([]int64, len(l.shards))}
	for i := range l.shards {
		r.shards[i] = make([]refSlot, len(l.shards[i].slots))
		r.floors[i] = math.MinInt64
	}
	return r
}

func (r *refTable) allow(addr netip.Addr, now int64) bool {
	k, ok := r.l.keyOf(addr)
	if !ok {
		r.overflows++
		return r.allowOverflow(now)
	}
	s, fp := r.l.shardOf(k)
	si := 0
	for i := range r.l.shards {
		if &r.l.shards[i] == s {
			si = i
		}
	}
	slots, ways := r.shards[si], s.ways
	g1, g2 := s.groupsOf(fp)
	grp := func(g int) []refSlot { return slots[g*ways : (g+1)*ways] }
	for _, g := range []int{g1, g2} {
		for i := range grp(g) {
			if sl := &grp(g)[i]; sl.fp == fp {
				next, ok := r.l.admit(sl.tat, now)
				sl.tat = next
				return ok
			}
		}
	}
	empties := func(g []refSlot) (n int, first *refSlot) {
		for i := range g {
			if g[i].fp == 0 {
				if first == nil {
					first = &g[i]
				}
				n++
			}
		}
		return n, first
	}
	oldest := func(g []refSlot) *refSlot {
		var found *refSlot
		for i := range g {
			if g[i].tat <= now && (found == nil || g[i].tat < found.tat) {
				found = &g[i]
			}
		}
		return found
	}
	var sl *refSlot
	e1, f1 := empties(grp(g1))
	e2, f2 := empties(grp(g2))
	switch {
	case e1 > 0 && e1 >= e2:
		sl = f1
		r.size++
	case e2 > 0:
		sl = f2
		r.size++
	default:
		sl = oldest(grp(g1))
		if o := oldest(grp(g2)); o != nil && (sl == nil || o.tat < sl.tat) {
			sl = o
		}
		if sl == nil {
			r.overflows++
			return r.allowOverflow(now)
		}
		r.floors[si] = max(r.floors[si], sl.tat)
		r.evictions++
	}
	sl.fp, sl.tat = fp, max(now, r.floors[si])
	next, ok := r.l.admit(sl.tat, now)
	sl.tat = next
	return ok
}

func (r *refTable) allowOverflow(now int64) bool {
	next, ok := r.l.admit(r.overflow, now)
	r.overflow = next
	return ok
}

// TestClientLimiterMatchesPreviousTable plays random single-goroutine
// timelines (many prefixes for small tables, ways 1..8, 1..3 shards, burst
// 1..3, huge rates, ZeroBits, readings that step back, go stale or sit at
// the clamp edges) on the table and on refTable, and requires the same
// answer to every call and the same Len, Evictions and Overflows: the
// lock-free table changed nothing but how a prefix is named.
func TestClientLimiterMatchesPreviousTable(t *testing.T) {
	deadline := time.Now().Add(2 * time.Minute) // a bound on time besides the one on count; 4.5 s on a quiet machine under -race
	rng := rand.New(rand.NewPCG(11, 12))
	for c := range 400 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d timelines within 2 minutes", c)
		}
		cfg := ClientLimiterConfig{
			Rate:      []float64{1, 1000, 1e9, 1e12}[rng.IntN(4)],
			Burst:     1 + rng.IntN(3),
			TableSize: 1 + rng.IntN(24),
			V4Len:     []int{32, 24, ZeroBits}[rng.IntN(3)],
			V6Len:     []int{64, 128, ZeroBits}[rng.IntN(3)],
		}
		shards, ways := 1+rng.IntN(3), 1+rng.IntN(clientWays)
		l := newClientLimiter(cfg, NewManualClock(t0), shards, ways)
		ref := newRefTable(l)
		interval := l.interval
		prefixes := 1 + rng.IntN(3*cfg.TableSize+2)
		now := int64(0)
		for step := range 3000 {
			switch x := rng.IntN(100); {
			case x < 40:
			case x < 75:
				now += rng.Int64N(3*interval + 1)
			case x < 85:
				now -= rng.Int64N(3*interval + 1) // a stale reading, or the clock stepping back
			case x < 90:
				now += rng.Int64N(int64(cfg.Burst)*interval*20 + 1)
			case x < 93:
				now = 1<<61 - rng.Int64N(2*interval+1) // the clamp's top
			case x < 96:
				now = -1<<61 + rng.Int64N(2*interval+1) // its bottom
			default:
				now = rng.Int64N(int64(time.Hour))
			}
			var addr netip.Addr
			switch p := rng.IntN(prefixes + 1); {
			case p == prefixes:
				// the zero Addr: the overflow bucket
			case p%2 == 0:
				addr = netip.AddrFrom4([4]byte{127, 0, byte(p >> 8), byte(p)})
			default:
				addr = netip.AddrFrom16([16]byte{0x20, 0x01, 0xd, 0xb8, 14: byte(p >> 8), 15: byte(p)})
			}
			want := ref.allow(addr, now)
			if got := l.allow(addr, now, nil); got != want {
				t.Fatalf("timeline %d (%+v, %d shards, %d ways) step %d: allow(%v, %d) = %v, previous table %v",
					c, cfg, shards, ways, step, addr, now, got, want)
			}
		}
		if l.Len() != ref.size || l.Evictions() != ref.evictions || l.Overflows() != ref.overflows {
			t.Fatalf("timeline %d (%+v, %d shards, %d ways): Len, Evictions, Overflows = %d, %d, %d; previous table %d, %d, %d",
				c, cfg, shards, ways, l.Len(), l.Evictions(), l.Overflows(), ref.size, ref.evictions, ref.overflows)
		}
		checkClientTable(t, l)
	}
}

// TestClientLimiterBoundUnderRaces runs goroutines on tiny tables with
// readings of their own (a shared time that they move forward, each reading
// up to three tokens stale), and checks the bound of clients.go exactly for
// each prefix: with readings between a and b it is admitted at most
// burst + (b − a)/interval times from the table. The overflow bucket is kept
// empty in the first half so that every admission is a table one; in the
// second it works and may add, for all prefixes together, at most its own
// bound.
func TestClientLimiterBoundUnderRaces(t *testing.T) {
	const (
		goroutines = 4
		asks       = 3000 // per goroutine and run
		prefixes   = 24
	)
	deadline := time.Now().Add(2 * time.Minute) // a bound on time besides the one on count; 4.3 s on a quiet machine under -race
	rng := rand.New(rand.NewPCG(21, 22))
	for run := range 60 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d runs within 2 minutes", run)
		}
		overflow := run%2 == 1
		cfg := ClientLimiterConfig{Rate: []float64{1000, 1e9}[rng.IntN(2)], Burst: 1 + rng.IntN(3), TableSize: 1 + rng.IntN(9)}
		shards, ways := 1+rng.IntN(2), 1+rng.IntN(clientWays)
		l := newClientLimiter(cfg, NewManualClock(t0), shards, ways)
		if !overflow {
			l.overflow.Store(1 << 62) // refuses every reading: admissions are the table's only
		}
		interval, burst := l.interval, int64(cfg.Burst)
		var clock atomic.Int64
		var admitted [prefixes]atomic.Int64
		var lo, hi [prefixes]atomic.Int64
		for p := range prefixes {
			lo[p].Store(math.MaxInt64)
			hi[p].Store(math.MinInt64)
		}
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Add(1)
			seed := rng.Uint64()
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(seed, uint64(g)))
				for range asks {
					if r.IntN(4) == 0 {
						clock.Add(r.Int64N(2*interval + 1))
					}
					now := clock.Load() - r.Int64N(3*interval+1)
					p := r.IntN(prefixes)
					for v := lo[p].Load(); now < v && !lo[p].CompareAndSwap(v, now); v = lo[p].Load() {
					}
					for v := hi[p].Load(); now > v && !hi[p].CompareAndSwap(v, now); v = hi[p].Load() {
					}
					if l.allow(netip.AddrFrom4([4]byte{127, 0, 4, byte(p)}), now, nil) {
						admitted[p].Add(1)
					}
				}
			}()
		}
		waitGroupWithin(t, &wg, time.Minute)
		var excess, total int64
		gmin, gmax := int64(math.MaxInt64), int64(math.MinInt64)
		for p := range prefixes {
			n := admitted[p].Load()
			total += n
			if n == 0 {
				continue
			}
			gmin, gmax = min(gmin, lo[p].Load()), max(gmax, hi[p].Load())
			bound := burst + (hi[p].Load()-lo[p].Load())/interval
			if !overflow && n > bound {
				t.Fatalf("run %d (%+v, %d shards, %d ways): prefix %d admitted %d times from the table, bound %d",
					run, cfg, shards, ways, p, n, bound)
			}
			excess += max(0, n-bound)
		}
		if total == 0 {
			t.Fatalf("run %d: nothing admitted", run)
		}
		if ob := burst + (gmax-gmin)/interval; overflow && excess > ob {
			t.Fatalf("run %d (%+v): %d admitted beyond the prefixes' own bounds, more than the overflow bucket's %d",
				run, cfg, excess, ob)
		}
		checkClientTable(t, l)
		if capacity := l.Config().TableSize / min(ways, cfg.TableSize) * min(ways, cfg.TableSize); l.Len() > capacity {
			t.Fatalf("run %d: Len %d beyond the %d slots", run, l.Len(), capacity)
		}
	}
}

// TestClientLimiterStaleChecksDoNotStarveEviction: one goroutine takes
// tokens from p0 (the oldest bucket, full) with a reading older than the new
// prefix's, as fast as it can, while the new prefix arrives. Each of its
// tokens leaves p0 full at the new prefix's reading, so p0 stays the victim.
// Every trial must give the new prefix a slot: a bucket full at its reading
// was there to take. (An eviction by compare-and-swap against the tat seen
// when choosing failed here on the first trial, 16 times over, and sent the
// new prefix to the overflow bucket.)
func TestClientLimiterStaleChecksDoNotStarveEviction(t *testing.T) {
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{127, 0, 5, byte(i)}) }
	deadline := time.Now().Add(2 * time.Second)
	trials := 0
	for ; trials < 2000 && time.Now().Before(deadline); trials++ {
		// One group of 8; a token per ns, a burst of 2^30 (about 1 s).
		l := newClientLimiter(ClientLimiterConfig{Rate: 1e9, Burst: 1 << 30, TableSize: 8}, NewManualClock(t0), 1, clientWays)
		l.allow(addr(0), 0, nil) // p0: full again at 1 ns
		for i := 1; i < 8; i++ {
			l.allow(addr(i), int64(500*time.Millisecond), nil) // the others: at 0.5 s
		}
		var stop, started atomic.Bool
		hammered := make(chan struct{})
		go func() {
			defer close(hammered)
			for n := 0; n < 1_000_000 && !stop.Load(); n++ { // at most 1 ms of p0's tokens: it stays the oldest
				l.allow(addr(0), 0, nil)
				started.Store(true)
			}
		}()
		for !started.Load() && time.Now().Before(deadline) {
		}
		l.allow(addr(100), int64(time.Second), nil)
		held, evictions := l.holds(addr(100)), l.Evictions()
		stop.Store(true)
		select {
		case <-hammered:
		case <-time.After(time.Minute):
			t.Fatal("the hammering goroutine did not stop within a minute")
		}
		if !held {
			t.Fatalf("trial %d: the new prefix at 1 s got no slot (Evictions %d, Overflows %d) while p0's bucket, "+
				"taken from at a reading of 0, was full at 1 s and the oldest", trials, evictions, l.Overflows())
		}
	}
	if trials == 0 {
		t.Fatal("no trial ran")
	}
}
