package guard

// The per-client table measured with 100,000 prefixes in it, beside
// TokenBucket.Allow (one bucket, no table) in the same run, so the price of
// the table is the difference.

import (
	"math/rand/v2"
	"net/netip"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// benchClientTableSize is the default table size, filled in every benchmark.
const benchClientTableSize = 100_000

// benchHotClients is how many clients the hot benchmarks ask: their slots and
// groups stay in the CPU's caches.
const benchHotClients = 256

// benchClientAddr returns the i-th distinct client: three in four IPv4 hosts
// in 127.0.0.0/8, one in four IPv6 /64 networks in 2001:db8::/32.
func benchClientAddr(i int) netip.Addr {
	if i%4 == 3 {
		var b [16]byte
		b[0], b[1], b[2], b[3] = 0x20, 0x01, 0x0d, 0xb8
		b[4], b[5], b[6], b[7] = byte(i>>24), byte(i>>16), byte(i>>8), byte(i)
		b[15] = 1
		return netip.AddrFrom16(b)
	}
	return netip.AddrFrom4([4]byte{127, byte(i >> 16), byte(i >> 8), byte(i)})
}

// benchClientIndex returns i for the address benchClientAddr(i).
func benchClientIndex(addr netip.Addr) uint32 {
	b := addr.As16()
	if addr.Is4() {
		return uint32(b[13])<<16 | uint32(b[14])<<8 | uint32(b[15])
	}
	return uint32(b[4])<<24 | uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7])
}

// fillClientLimiter asks once for distinct clients until every slot of l is
// taken, and returns the clients that then hold a slot.
func fillClientLimiter(tb testing.TB, l *ClientLimiter) []netip.Addr {
	tb.Helper()
	size := l.Config().TableSize
	var asked []netip.Addr
	for i := 0; l.Len() < size; i++ {
		if i == 4*size {
			tb.Fatalf("%d clients asked, the table holds %d of %d", i, l.Len(), size)
		}
		asked = append(asked, benchClientAddr(i))
		l.Allow(asked[i])
	}
	held := asked[:0]
	for _, addr := range asked {
		if l.holds(addr) {
			held = append(held, addr)
		}
	}
	if len(held) != size {
		tb.Fatalf("%d clients hold a slot, want %d", len(held), size)
	}
	return held
}

// holds reports whether addr's prefix has a slot in the table.
func (l *ClientLimiter) holds(addr netip.Addr) bool {
	k, _ := l.keyOf(addr)
	s, fp := l.shardOf(k)
	g1, g2 := s.groupsOf(fp)
	return s.find(g1, g2, fp) != nil
}

func BenchmarkClientLimiter(b *testing.B) {
	// A rate so high that buckets are full again within a nanosecond: every
	// call is admitted and every new prefix finds a bucket to evict.
	const fastRate = 1e12

	full := NewClientLimiter(ClientLimiterConfig{Rate: fastRate, Burst: 1 << 20}, RealClock{})
	held := fillClientLimiter(b, full)
	// spread asks every client in the table in a shuffled order (a fixed
	// seed, so every run asks alike): consecutive checks land far apart in
	// a table of megabytes, larger than a core's caches, and miss them as
	// the checks of a busy proxy would. hot asks the same few clients over
	// and over: their slots stay in the cache. A client is named by its
	// index and its address built as it is asked for, as a proxy finds the
	// address in the packet it has just read: a list of 100,000 addresses
	// (2.4 MB) read alongside would double what the checks pull through
	// the caches, and measure the list as much as the table.
	spread := make([]uint32, len(held))
	for i, addr := range held {
		spread[i] = benchClientIndex(addr)
		if benchClientAddr(int(spread[i])) != addr {
			b.Fatalf("client %v named %d, which is %v", addr, spread[i], benchClientAddr(int(spread[i])))
		}
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(spread), func(i, j int) { spread[i], spread[j] = spread[j], spread[i] })
	for _, clients := range []struct {
		name  string
		order []uint32
	}{{"spread", spread}, {"hot", spread[:benchHotClients]}} {
		order := clients.order
		// warm asks every client once before the clock starts, as a busy
		// proxy's checks keep its table in the caches: what is measured is
		// the steady state, whatever the number of iterations. (Without it,
		// a short run counts the first round's misses, of a table just
		// filled, in its average: 300,000 iterations measured ~100 ns more
		// a check than 3,000,000.)
		warm := func() {
			for _, i := range order {
				full.Allow(benchClientAddr(int(i)))
			}
		}
		b.Run(clients.name+"/serial", func(b *testing.B) {
			warm()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				full.Allow(benchClientAddr(int(order[i])))
				if i++; i == len(order) {
					i = 0
				}
			}
		})
		b.Run(clients.name+"/serial-at", func(b *testing.B) {
			// The clock read by the caller, as the proxy reads it once per
			// query for both entry gates: the check without the clock. The
			// reading moves on once per round of the clients, a cost the
			// check does not have.
			warm()
			now := time.Now()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				full.AllowAt(now, benchClientAddr(int(order[i])))
				if i++; i == len(order) {
					i, now = 0, now.Add(time.Microsecond)
				}
			}
		})
		b.Run(clients.name+"/parallel", func(b *testing.B) {
			warm()
			b.ResetTimer()
			b.ReportAllocs()
			var goroutines atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				i := int(goroutines.Add(1)) * (len(order) / 16) % len(order) // each starts elsewhere
				for pb.Next() {
					full.Allow(benchClientAddr(int(order[i])))
					if i++; i == len(order) {
						i = 0
					}
				}
			})
		})
		b.Run(clients.name+"/parallel-at", func(b *testing.B) {
			warm()
			b.ResetTimer()
			b.ReportAllocs()
			var goroutines atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				i := int(goroutines.Add(1)) * (len(order) / 16) % len(order)
				now := time.Now()
				for pb.Next() {
					full.AllowAt(now, benchClientAddr(int(order[i])))
					if i++; i == len(order) {
						i, now = 0, now.Add(time.Microsecond)
					}
				}
			})
		})
	}
	// spread/floor is what no table of this size can do better than on the
	// machine at hand: the checks' slot reads alone, in the same shuffled
	// order over the same bytes (16 per prefix), each read depending on the
	// one before (a check's compare-and-swap lets no later read start before
	// it ends). With the table in
	// the shared last-level cache this is a few tens of nanoseconds; when
	// other tenants of the machine evict it, the read goes to memory and the
	// floor rises to ~200 ns, and spread/serial with it. Read spread against
	// the floor of the same run.
	b.Run("spread/floor", func(b *testing.B) {
		slots := make([]clientSlot, len(spread))
		order := rand.New(rand.NewPCG(3, 4)).Perm(len(slots))
		for i, j := range order {
			slots[j].tat.Store(int64(order[(i+1)%len(order)]))
		}
		b.ReportAllocs()
		next := int64(order[0])
		for b.Loop() {
			next = slots[next].tat.Load()
		}
		runtime.KeepAlive(next)
	})
	b.Run("token-bucket", func(b *testing.B) {
		tb := NewTokenBucket(fastRate, 1<<20, RealClock{})
		b.ReportAllocs()
		for b.Loop() {
			tb.Allow(1)
		}
	})
	b.Run("token-bucket-at", func(b *testing.B) {
		tb := NewTokenBucket(fastRate, 1<<20, RealClock{})
		now := time.Now()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			tb.AllowAt(now, 1)
			if i++; i == 1024 {
				i, now = 0, now.Add(time.Microsecond)
			}
		}
	})
	b.Run("token-bucket-parallel", func(b *testing.B) {
		tb := NewTokenBucket(fastRate, 1<<20, RealClock{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				tb.Allow(1)
			}
		})
	})
	b.Run("new-prefix-evicts", func(b *testing.B) {
		i := 1 << 24 // clients never asked before
		b.ReportAllocs()
		for b.Loop() {
			full.Allow(benchClientAddr(i))
			i++
		}
	})
	b.Run("new-prefix-overflows", func(b *testing.B) {
		// Slow buckets stay busy for an hour: every new prefix overflows.
		busy := NewClientLimiter(ClientLimiterConfig{Rate: 1.0 / 3600, Burst: 1}, RealClock{})
		fillClientLimiter(b, busy)
		i := 1 << 24
		b.ReportAllocs()
		for b.Loop() {
			busy.Allow(benchClientAddr(i))
			i++
		}
	})
	b.Run("exempt", func(b *testing.B) {
		l := NewClientLimiter(ClientLimiterConfig{Rate: fastRate, Exempt: []netip.Prefix{
			netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("127.0.0.0/8"),
		}}, RealClock{})
		addr := netip.MustParseAddr("127.0.0.1")
		b.ReportAllocs()
		for b.Loop() {
			l.Allow(addr)
		}
	})
}

// BenchmarkClientTableMemory reports the heap a full table of 100,000
// prefixes takes, per prefix: the table's memory bound. Each iteration builds
// and fills a table, so it is named apart from BenchmarkClientLimiter: a
// -benchtime of many iterations meant for the checks would run for hours.
func BenchmarkClientTableMemory(b *testing.B) {
	var perEntry float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		l := NewClientLimiter(ClientLimiterConfig{Rate: 10}, RealClock{})
		fillClientLimiter(b, l)
		runtime.GC()
		runtime.ReadMemStats(&after)
		perEntry = float64(after.HeapAlloc-before.HeapAlloc) / benchClientTableSize
		runtime.KeepAlive(l)
	}
	b.ReportMetric(perEntry, "B/entry")
}

func BenchmarkAccessListContains(b *testing.B) {
	acl := DefaultAccessList()
	for _, s := range []string{"192.168.1.1", "192.0.2.1", "fd00::1", "2001:db8::1"} {
		addr := netip.MustParseAddr(s)
		b.Run(s, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				acl.Contains(addr)
			}
		})
	}
}
