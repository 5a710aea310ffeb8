package guard

import (
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// newTestClientLimiter builds a limiter on a manual clock at t0. shards is the
// number of lock shards; tests that need a deterministic eviction order use
// 1, with a TableSize of 8 or less: one group, where every prefix lives.
func newTestClientLimiter(t *testing.T, cfg ClientLimiterConfig, shards int) (*ClientLimiter, *ManualClock) {
	t.Helper()
	clock := NewManualClock(t0)
	return newClientLimiter(cfg, clock, shards, clientWays), clock
}

// clientStep is one line of a per-client timeline: at offset at, addr asks
// for one token and expects ok.
type clientStep struct {
	at   time.Duration
	addr string
	ok   bool
}

// runClientSteps plays a timeline on l, setting clock before each step.
func runClientSteps(t *testing.T, l *ClientLimiter, clock *ManualClock, steps []clientStep) {
	t.Helper()
	for i, s := range steps {
		clock.Set(t0.Add(s.at))
		if got := l.Allow(netip.MustParseAddr(s.addr)); got != s.ok {
			t.Fatalf("step %d (at %v, %s): Allow = %v, want %v", i, s.at, s.addr, got, s.ok)
		}
	}
}

// runClientStepsAt plays a timeline through AllowAt, the caller's readings,
// on a clock that never moves.
func runClientStepsAt(t *testing.T, l *ClientLimiter, steps []clientStep) {
	t.Helper()
	for i, s := range steps {
		if got := l.AllowAt(t0.Add(s.at), netip.MustParseAddr(s.addr)); got != s.ok {
			t.Fatalf("step %d (at %v, %s): AllowAt = %v, want %v", i, s.at, s.addr, got, s.ok)
		}
	}
}

func TestClientLimiterRefillAndBurst(t *testing.T) {
	tests := []struct {
		name  string
		cfg   ClientLimiterConfig
		steps []clientStep
	}{
		{"each prefix starts full, then refuses", ClientLimiterConfig{Rate: 10, Burst: 3}, []clientStep{
			{0, "127.0.0.1", true}, {0, "127.0.0.1", true}, {0, "127.0.0.1", true}, {0, "127.0.0.1", false},
			{0, "127.0.0.2", true}, {0, "127.0.0.2", true}, {0, "127.0.0.2", true}, {0, "127.0.0.2", false},
		}},
		{"refills at rate", ClientLimiterConfig{Rate: 10, Burst: 3}, []clientStep{
			{0, "127.0.0.1", true}, {0, "127.0.0.1", true}, {0, "127.0.0.1", true}, {0, "127.0.0.1", false},
			{99 * time.Millisecond, "127.0.0.1", false},
			{100 * time.Millisecond, "127.0.0.1", true}, {100 * time.Millisecond, "127.0.0.1", false},
			{300 * time.Millisecond, "127.0.0.1", true}, {300 * time.Millisecond, "127.0.0.1", true},
			{300 * time.Millisecond, "127.0.0.1", false},
		}},
		{"refill is capped at burst", ClientLimiterConfig{Rate: 10, Burst: 2}, []clientStep{
			{0, "127.0.0.1", true}, {0, "127.0.0.1", true}, {0, "127.0.0.1", false},
			{time.Hour, "127.0.0.1", true}, {time.Hour, "127.0.0.1", true}, {time.Hour, "127.0.0.1", false},
		}},
		{"fractional rate", ClientLimiterConfig{Rate: 0.5, Burst: 1}, []clientStep{
			{0, "2001:db8::1", true}, {time.Second, "2001:db8::1", false},
			{1999 * time.Millisecond, "2001:db8::1", false}, {2 * time.Second, "2001:db8::1", true},
		}},
		{"burst defaults to the rate, rounded up", ClientLimiterConfig{Rate: 1.5}, []clientStep{
			{0, "127.0.0.1", true}, {0, "127.0.0.1", true}, {0, "127.0.0.1", false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, clock := newTestClientLimiter(t, tt.cfg, 1)
			runClientSteps(t, l, clock, tt.steps)
		})
		t.Run(tt.name+", AllowAt", func(t *testing.T) {
			l, _ := newTestClientLimiter(t, tt.cfg, 1)
			runClientStepsAt(t, l, tt.steps)
		})
	}
}

// TestClientLimiterPrefixes drains a's bucket, then asks for b: b is refused
// exactly when a and b name the same client.
func TestClientLimiterPrefixes(t *testing.T) {
	tests := []struct {
		name         string
		v4len, v6len int
		a, b         string
		shared       bool
	}{
		{"default /32: two hosts apart", 0, 0, "127.0.0.1", "127.0.0.2", false},
		{"default /32: one host", 0, 0, "127.0.0.1", "127.0.0.1", true},
		{"/24: one network", 24, 0, "127.0.0.1", "127.0.0.254", true},
		{"/24: the next network", 24, 0, "127.0.0.1", "127.0.1.1", false},
		{"/1: the low half", 1, 0, "127.0.0.1", "0.0.0.1", true},
		{"/1: the top bit apart", 1, 0, "127.0.0.1", "128.0.0.1", false},
		{"/0 for IPv4: one bucket for every IPv4 client", ZeroBits, 0, "127.0.0.1", "203.0.113.9", true},
		{"default /64: one network", 0, 0, "2001:db8::1", "2001:db8::ffff:1", true},
		{"default /64: the next network", 0, 0, "2001:db8::1", "2001:db8:0:1::1", false},
		{"/128: two hosts apart", 0, 128, "2001:db8::1", "2001:db8::2", false},
		{"/128: one host", 0, 128, "2001:db8::1", "2001:db8::1", true},
		{"/0 for IPv6: one bucket for every IPv6 client", 0, ZeroBits, "2001:db8::1", "fd00::1", true},
		{"/0 for both: IPv4 and IPv6 still apart", ZeroBits, ZeroBits, "127.0.0.1", "2001:db8::1", false},
		{"IPv4-mapped IPv6 counts as IPv4", 0, 0, "::ffff:127.0.0.1", "127.0.0.1", true},
		{"IPv4-mapped takes the IPv4 length", 24, 128, "::ffff:127.0.0.1", "::ffff:127.0.0.9", true},
		{"IPv6 beside the mapped range stays IPv6", 32, 95, "0.0.0.0", "::fffe:0:0", false},
		{"link-local: another link, another client", 0, 0, "fe80::1%eth0", "fe80::1%eth1", false},
		{"link-local: another link, another client at /128", 0, 128, "fe80::1%2", "fe80::1%3", false},
		{"link-local: one link, one network", 0, 0, "fe80::1%eth0", "fe80::2%eth0", true},
		{"link-local: a prefix of /16 joins the links", 0, 16, "fe80::1%eth0", "fe80::2%eth1", true},
		{"a global address: the zone is not part of the client", 0, 0, "2001:db8::1%eth0", "2001:db8::1%eth1", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, _ := newTestClientLimiter(t, ClientLimiterConfig{Rate: 1, Burst: 2, V4Len: tt.v4len, V6Len: tt.v6len}, 1)
			a, b := netip.MustParseAddr(tt.a), netip.MustParseAddr(tt.b)
			if !l.Allow(a) || !l.Allow(a) {
				t.Fatalf("%s: a fresh bucket refused within its burst of 2", a)
			}
			if got := l.Allow(b); got == tt.shared {
				t.Fatalf("after %s spent its burst, Allow(%s) = %v: shared = %v, want %v", a, b, got, !got, tt.shared)
			}
		})
	}
}

func TestClientLimiterEviction(t *testing.T) {
	// One shard of 3 prefixes, rate 1/s, burst 2: one token back per second.
	cfg := ClientLimiterConfig{Rate: 1, Burst: 2, TableSize: 3}
	const a, b, c, d, e = "127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"
	const f, g, h = "127.0.0.6", "127.0.0.7", "127.0.0.8"
	tests := []struct {
		name                 string
		steps                []clientStep
		evictions, overflows uint64
	}{
		{"a new prefix with room takes a slot", []clientStep{
			{0, a, true}, {0, b, true}, {0, c, true},
		}, 0, 0},
		{"full buckets go, a busy one stays with its balance", []clientStep{
			{0, a, true}, {0, a, true}, // a: empty, full again at 2 s
			{0, b, true}, {0, c, true}, // b, c: full again at 1 s
			{time.Second, d, true}, // evicts b: full, so nothing is lost
			{time.Second, e, true}, // evicts c; a is never a candidate
			{time.Second, a, true}, // a earned one token in 1 s: not reset to 2
			{time.Second, a, false},
		}, 2, 0},
		{"the bucket full the longest goes first", []clientStep{
			{0, b, true}, {0, b, true}, // b: full again at 2 s
			{0, a, true},                                   // a: full again at 1 s
			{time.Second, c, true}, {time.Second, c, true}, // c: busy until 3 s
			{2 * time.Second, d, true}, // b and a are full: evicts a, full since 1 s
			{2 * time.Second, b, true}, // b kept its slot
			{2 * time.Second, a, true}, // a finds d, b, c busy: the overflow bucket
		}, 1, 1},
		{"an idle bucket goes", []clientStep{
			{0, a, true}, {0, a, true}, {0, b, true}, {0, b, true},
			{time.Hour, c, true}, // a and b have been idle for an hour
			{time.Hour, d, true},
			{time.Hour, e, true}, // c, d, e: one token each, busy
			{time.Hour, c, true}, // c has its second token: it was never evicted
			{time.Hour, c, false},
		}, 2, 0},
		{"busy buckets stay; new prefixes share one overflow bucket", []clientStep{
			{0, a, true}, {0, b, true}, {0, c, true}, // all busy until 1 s
			{500 * time.Millisecond, d, true}, // no room: the overflow bucket's first token
			{500 * time.Millisecond, e, true}, // its second: d and e share it
			{500 * time.Millisecond, f, false},
			{500 * time.Millisecond, a, true}, // a, b, c keep their state
			{500 * time.Millisecond, a, false},
			{500 * time.Millisecond, b, true},
			{time.Second, g, true}, // c is full again at 1 s: g takes its slot
		}, 1, 3},
		{"an evicted prefix coming back into a busy table overflows", []clientStep{
			{0, a, true}, {0, b, true}, {0, c, true},
			{time.Second, d, true}, {time.Second, d, true}, // evicts a; d is empty
			{time.Second, e, true}, {time.Second, f, true}, // evict b, c
			{time.Second, a, true}, {time.Second, g, true}, // a and g share the overflow bucket
			{time.Second, h, false},
		}, 3, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, clock := newTestClientLimiter(t, cfg, 1)
			runClientSteps(t, l, clock, tt.steps)
			if got := l.Len(); got != 3 {
				t.Errorf("Len = %d, want 3", got)
			}
			if got := l.Evictions(); got != tt.evictions {
				t.Errorf("Evictions = %d, want %d", got, tt.evictions)
			}
			if got := l.Overflows(); got != tt.overflows {
				t.Errorf("Overflows = %d, want %d", got, tt.overflows)
			}
		})
	}
}

// TestClientLimiterSourceFlood sends 1,000,000 distinct sources at a limiter
// whose table holds heavy legitimate prefixes. The legitimate prefixes keep
// their balances, and the flood as a whole gets no more than the bound.
func TestClientLimiterSourceFlood(t *testing.T) {
	const (
		rate    = 10
		burst   = 20
		size    = 1000
		sources = 1_000_000
		step    = time.Millisecond // the clock moves 1 ms every 1,000 queries: the flood lasts 1 s
	)
	tests := []struct {
		name  string
		heavy int // legitimate prefixes that spend their whole burst at t0
		// most the flood may get: heavy prefixes are busy throughout, so the
		// flood has the other slots and the overflow bucket, each worth at
		// most burst + rate × elapsed
		bound     int
		evictions bool // the flood must have recycled slots
		overflow  bool // every flood query must have gone to the overflow bucket
	}{
		{"table full of busy prefixes: the flood shares one bucket", size, 1 * (burst + rate), false, true},
		{"one heavy prefix, the flood cycles through the rest", 1, size * (burst + rate), true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, clock := newTestClientLimiter(t, ClientLimiterConfig{Rate: rate, Burst: burst, TableSize: size}, defaultClientShards)
			// Heavy legitimate clients in 127.200.0.0/16, the flood in 127.0.0.0/12.
			heavy := make([]netip.Addr, 0, tt.heavy)
			for i := 0; len(heavy) < tt.heavy && i < 1<<16; i++ {
				addr := netip.AddrFrom4([4]byte{127, 200, byte(i >> 8), byte(i)})
				before := l.Len()
				if !l.Allow(addr) {
					continue // its groups were full: the overflow bucket, now empty
				}
				if l.Len() == before {
					continue
				}
				for range burst - 1 {
					if !l.Allow(addr) {
						t.Fatalf("%s refused within its burst", addr)
					}
				}
				heavy = append(heavy, addr)
			}
			if len(heavy) != tt.heavy || l.Len() != tt.heavy {
				t.Fatalf("filled %d heavy prefixes (Len %d), want %d", len(heavy), l.Len(), tt.heavy)
			}
			evictionsBefore, overflowsBefore := l.Evictions(), l.Overflows()

			admitted := 0
			for i := range sources {
				if i%1000 == 0 && i > 0 {
					clock.Advance(step)
				}
				addr := netip.AddrFrom4([4]byte{127, byte(i >> 16), byte(i >> 8), byte(i)})
				if l.Allow(addr) {
					admitted++
				}
			}
			elapsed := clock.Now().Sub(t0)
			t.Logf("the flood got %d of %d through in %v; %d evictions, %d overflows", admitted, sources, elapsed,
				l.Evictions()-evictionsBefore, l.Overflows()-overflowsBefore)
			if admitted > tt.bound {
				t.Errorf("the flood got %d queries through in %v, want at most %d", admitted, elapsed, tt.bound)
			}
			if admitted == 0 {
				t.Errorf("the flood got nothing through: the overflow bucket never admitted")
			}
			if got := l.Evictions() > evictionsBefore; got != tt.evictions {
				t.Errorf("evictions during the flood: %v (%d), want %v", got, l.Evictions()-evictionsBefore, tt.evictions)
			}
			if got := l.Overflows() - overflowsBefore; tt.overflow && got != sources {
				t.Errorf("%d flood queries went to the overflow bucket, want all %d", got, sources)
			}
			// Each heavy prefix spent its 20 tokens at t0 and has earned
			// rate × elapsed since: 9 at 0.999 s. A reset bucket would give 20.
			want := int(rate * elapsed.Seconds())
			for _, addr := range heavy {
				got := 0
				for range 2 * burst {
					if l.Allow(addr) {
						got++
					}
				}
				if got != want {
					t.Fatalf("%s after the flood: %d admitted, want %d (its balance kept)", addr, got, want)
				}
			}
		})
	}
}

func TestClientLimiterExempt(t *testing.T) {
	cfg := ClientLimiterConfig{Rate: 1, Burst: 1, TableSize: 1, Exempt: []netip.Prefix{
		netip.MustParsePrefix("127.0.0.0/24"), netip.MustParsePrefix("2001:db8::/48"),
	}}
	tests := []struct {
		addr   string
		exempt bool
	}{
		{"127.0.0.1", true},
		{"127.0.0.255", true},
		{"::ffff:127.0.0.9", true},
		{"2001:db8::1", true},
		{"2001:db8:0:ffff::1", true},
		{"127.0.1.1", false},
		{"2001:db8:1::1", false},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			l, _ := newTestClientLimiter(t, cfg, 1)
			addr := netip.MustParseAddr(tt.addr)
			got, gotAt := 0, 0
			for range 100 {
				if l.Allow(addr) {
					got++
				}
				if l.AllowAt(t0, addr) {
					gotAt++
				}
			}
			want, wantLen := 1, 1 // the one token of the burst, on a clock that stands still
			if tt.exempt {
				want, wantLen = 200, 0
			}
			if got+gotAt != want || l.Len() != wantLen {
				t.Fatalf("100 asks from %s with Allow and 100 with AllowAt: %d and %d admitted, Len %d; want %d in all, Len %d",
					addr, got, gotAt, l.Len(), want, wantLen)
			}
		})
	}
}

// TestClientLimiterStaleReading plays the interleaving where a goroutine
// reads the clock, loses the race to the lock, and applies its reading after
// a later one: the older reading must find fewer tokens, never move a
// bucket's time back, and never earn the same interval twice.
func TestClientLimiterStaleReading(t *testing.T) {
	const a = "127.0.0.1"
	tests := []struct {
		name  string
		cfg   ClientLimiterConfig
		steps []clientStep
	}{
		{"a stale reading on a live bucket", ClientLimiterConfig{Rate: 1, Burst: 1}, []clientStep{
			{0, a, true},
			{time.Second, a, true},             // the token earned in [0, 1 s]
			{500 * time.Millisecond, a, false}, // stale: must not rewind the bucket to 0.5 s
			{1500 * time.Millisecond, a, false},
			{2 * time.Second, a, true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, clock := newTestClientLimiter(t, tt.cfg, 1)
			runClientSteps(t, l, clock, tt.steps)
		})
		t.Run(tt.name+", AllowAt", func(t *testing.T) {
			l, _ := newTestClientLimiter(t, tt.cfg, 1)
			runClientStepsAt(t, l, tt.steps)
		})
	}
}

// TestClientLimiterStaleRecreation plays a stale reading that re-creates an
// evicted prefix in its other group, where an older full bucket is waiting:
// the new bucket must start where the evicted one ended, not at the stale
// reading, or the prefix earns the interval between them twice.
func TestClientLimiterStaleRecreation(t *testing.T) {
	// One shard, two groups of two slots; rate 1/s, burst 2.
	clock := NewManualClock(t0)
	l := newClientLimiter(ClientLimiterConfig{Rate: 1, Burst: 2, TableSize: 4}, clock, 1, 2)
	var used []netip.Addr
	in := func(g1, g2 int) string { // a new address whose prefix lives in groups g1 or g2
		t.Helper()
		for i := range 1 << 16 {
			addr := netip.AddrFrom4([4]byte{127, 0, byte(i >> 8), byte(i)})
			k, _ := l.keyOf(addr)
			s, hash := l.shardOf(k)
			f1, f2 := s.groupsOf(hash)
			if f1 == g1 && f2 == g2 && !slices.Contains(used, addr) {
				used = append(used, addr)
				return addr.String()
			}
		}
		t.Fatalf("no address in groups %d, %d", g1, g2)
		return ""
	}
	a := in(0, 1)              // groups 0, then 1
	z, c := in(0, 0), in(0, 0) // group 0 only
	y, w := in(1, 1), in(1, 1) // group 1 only
	runClientSteps(t, l, clock, []clientStep{
		{0, a, true}, {0, a, true}, // group 0: a, empty, full again at 2 s
		{0, z, true}, {0, z, true}, // group 0: z, full again at 2 s
		{0, y, true},               // group 1: y, full again at 1 s
		{0, w, true}, {0, w, true}, // group 1: w, full again at 2 s
		{2 * time.Second, c, true}, // evicts a, full at 2 s (y is not c's to take)
		// Stale: a comes back in y's slot, full from 2 s (when the evicted
		// a was), not from the stale 1.5 s: 1.5 tokens, not 2.
		{1500 * time.Millisecond, a, true},
		{2500 * time.Millisecond, a, true},
		{2500 * time.Millisecond, a, false}, // from 1.5 s, a would have earned [1.5 s, 2 s] twice
	})
	if got := l.Evictions(); got != 2 {
		t.Fatalf("Evictions = %d, want 2 (a, then y)", got)
	}
}

// TestClientLimiterConcurrent runs many goroutines on the real clock and
// checks the bound that holds whatever the interleaving: a prefix is never
// admitted more than burst + rate × elapsed times from its table slot, and
// the overflow bucket adds at most as much again for all prefixes together.
func TestClientLimiterConcurrent(t *testing.T) {
	const (
		rate       = 1000
		burst      = 5
		prefixes   = 50
		goroutines = 8
		asks       = 20_000 // per goroutine
	)
	tests := []struct {
		name      string
		tableSize int
		overflow  bool // prefixes outnumber the slots
	}{
		{"room for every prefix", 100_000, false},
		{"more prefixes than slots", 16, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			l := NewClientLimiter(ClientLimiterConfig{Rate: rate, Burst: burst, V6Len: 128, TableSize: tt.tableSize}, RealClock{})
			addrs := make([]netip.Addr, prefixes)
			for i := range addrs {
				if i%2 == 0 {
					addrs[i] = netip.AddrFrom4([4]byte{127, 0, 1, byte(i)})
				} else {
					addrs[i] = netip.MustParseAddr(fmt.Sprintf("2001:db8::%x", i))
				}
			}
			var admitted [prefixes]atomic.Int64
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range asks {
						p := (i*7 + g) % prefixes
						if l.Allow(addrs[p]) {
							admitted[p].Add(1)
						}
					}
				}()
			}
			waitGroupWithin(t, &wg, time.Minute)
			elapsed := time.Since(start)
			bound := burst + rate*elapsed.Seconds()
			excess, total := 0.0, int64(0)
			for p := range admitted {
				n := admitted[p].Load()
				total += n
				excess += max(0, float64(n)-bound)
			}
			if !tt.overflow && excess > 0 {
				t.Errorf("some prefix got %v more than burst + rate × elapsed (%v in %v)", excess, bound, elapsed)
			}
			if tt.overflow && excess > bound {
				t.Errorf("prefixes got %v beyond their own bound (%v), more than the overflow bucket holds", excess, bound)
			}
			if limit := float64(tt.tableSize+1) * bound; float64(total) > limit {
				t.Errorf("%d admitted in all, more than (slots + overflow) × bound = %v", total, limit)
			}
			if got := l.Overflows() > 0; got != tt.overflow {
				t.Errorf("Overflows = %d, want overflow %v", l.Overflows(), tt.overflow)
			}
			if total == 0 {
				t.Error("nothing admitted")
			}
		})
	}
}

func TestNewClientLimiterDefaultsAndEdges(t *testing.T) {
	tests := []struct {
		name string
		cfg  ClientLimiterConfig
		want ClientLimiterConfig
	}{
		{"zero fields take their defaults", ClientLimiterConfig{Rate: 10},
			ClientLimiterConfig{Rate: 10, Burst: 10, V4Len: 32, V6Len: 64, TableSize: 100_000}},
		{"the longest prefixes", ClientLimiterConfig{Rate: 10, Burst: 1, V4Len: 32, V6Len: 128, TableSize: 1},
			ClientLimiterConfig{Rate: 10, Burst: 1, V4Len: 32, V6Len: 128, TableSize: 1}},
		{"ZeroBits is a prefix of length 0", ClientLimiterConfig{Rate: 10, V4Len: ZeroBits, V6Len: ZeroBits},
			ClientLimiterConfig{Rate: 10, Burst: 10, V4Len: ZeroBits, V6Len: ZeroBits, TableSize: 100_000}},
		{"length 1", ClientLimiterConfig{Rate: 10, V4Len: 1, V6Len: 1},
			ClientLimiterConfig{Rate: 10, Burst: 10, V4Len: 1, V6Len: 1, TableSize: 100_000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := NewClientLimiter(tt.cfg, NewManualClock(t0)).Config()
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("Config = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestClientLimiterTableSize offers ten times as many busy prefixes as the
// table holds: Len stops at the size, rounded down to whole groups of 8.
func TestClientLimiterTableSize(t *testing.T) {
	tests := []struct{ size, want int }{{1, 1}, {7, 7}, {8, 8}, {9, 8}, {100, 96}, {1000, 1000}}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.size), func(t *testing.T) {
			l, _ := newTestClientLimiter(t, ClientLimiterConfig{Rate: 1, Burst: 1, TableSize: tt.size}, defaultClientShards)
			for i := range 10 * tt.size {
				l.Allow(netip.AddrFrom4([4]byte{127, 0, byte(i >> 8), byte(i)}))
			}
			if got := l.Len(); got != tt.want {
				t.Fatalf("Len = %d, want %d", got, tt.want)
			}
			if l.Evictions() != 0 {
				t.Fatalf("%d evictions of busy buckets", l.Evictions())
			}
		})
	}
}

// TestClientLimiterFillsEvenly offers new busy prefixes, one at a time, to
// tables of the default size until the first one finds no slot. A new prefix
// takes the emptier of its two groups, so the groups fill evenly and the
// table is mostly full by then (about 3/4 of it, measured); filling the
// first group with room before the second would overflow at 1/4 to 2/5.
func TestClientLimiterFillsEvenly(t *testing.T) {
	const size, want = 100_000, 60_000
	for run := range 3 {
		l, _ := newTestClientLimiter(t, ClientLimiterConfig{Rate: 1, Burst: 1, TableSize: size}, defaultClientShards)
		for i := 0; l.Overflows() == 0; i++ {
			if i == size {
				t.Fatalf("run %d: %d new prefixes and no overflow in a table of %d", run, i, size)
			}
			l.Allow(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}))
		}
		if l.Len() < want {
			t.Fatalf("run %d: the first overflow came with %d of %d slots taken, want at least %d", run, l.Len(), size, want)
		}
	}
}

func TestClientLimiterZeroAddrSharesOverflow(t *testing.T) {
	l, _ := newTestClientLimiter(t, ClientLimiterConfig{Rate: 1, Burst: 1}, defaultClientShards)
	if !l.Allow(netip.Addr{}) || l.Allow(netip.Addr{}) {
		t.Fatal("the zero Addr did not get exactly the overflow bucket's one token")
	}
	if l.Len() != 0 || l.Overflows() != 2 {
		t.Fatalf("Len %d, Overflows %d; want 0 and 2", l.Len(), l.Overflows())
	}
}

func TestNewClientLimiterRejects(t *testing.T) {
	tests := []struct {
		name string
		cfg  ClientLimiterConfig
	}{
		{"zero rate", ClientLimiterConfig{}},
		{"negative rate", ClientLimiterConfig{Rate: -1}},
		{"NaN rate", ClientLimiterConfig{Rate: nanRate()}},
		{"negative burst", ClientLimiterConfig{Rate: 1, Burst: -1}},
		{"IPv4 length 33", ClientLimiterConfig{Rate: 1, V4Len: 33}},
		{"IPv4 length below ZeroBits", ClientLimiterConfig{Rate: 1, V4Len: -2}},
		{"IPv6 length 129", ClientLimiterConfig{Rate: 1, V6Len: 129}},
		{"negative table size", ClientLimiterConfig{Rate: 1, TableSize: -1}},
		{"burst/rate beyond a century", ClientLimiterConfig{Rate: 1e-9, Burst: 100}},
		{"one token per 30,000 years", ClientLimiterConfig{Rate: 1e-12, Burst: 1}},
		{"an invalid exempt prefix", ClientLimiterConfig{Rate: 1, Exempt: []netip.Prefix{{}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			NewClientLimiter(tt.cfg, NewManualClock(t0))
		})
	}
}

func nanRate() float64 {
	zero := 0.0
	return zero / zero
}

func TestClientLimiterAllocs(t *testing.T) {
	l, clock := newTestClientLimiter(t, ClientLimiterConfig{Rate: 1, Burst: 1, TableSize: 2,
		Exempt: []netip.Prefix{netip.MustParsePrefix("127.1.0.0/16")}}, 1)
	next := uint32(0)
	tests := []struct {
		name string
		addr func() netip.Addr
	}{
		{"a prefix in the table", func() netip.Addr { return netip.MustParseAddr("127.0.0.1") }},
		{"a new prefix each time", func() netip.Addr {
			next++
			clock.Advance(time.Hour) // every bucket full: each new prefix evicts one
			return netip.AddrFrom4([4]byte{127, 2, byte(next >> 8), byte(next)})
		}},
		{"an exempt prefix", func() netip.Addr { return netip.MustParseAddr("127.1.2.3") }},
		{"IPv6", func() netip.Addr { return netip.MustParseAddr("2001:db8::1") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// One run of 10,000 calls: AllocsPerRun rounds the mean down, so
			// this counts every allocation, however rare.
			if n := testing.AllocsPerRun(1, func() {
				for range 5000 {
					l.Allow(tt.addr())
					l.AllowAt(clock.Now(), tt.addr())
				}
			}); n != 0 {
				t.Fatalf("10,000 calls of Allow and AllowAt allocated %v times, want 0", n)
			}
		})
	}
}

// TestClientShardChurn evicts and adds prefixes many times, checking after
// each step what lookups rely on: every prefix sits in one of its two
// groups, none is held twice, and the count matches the slots in use.
func TestClientShardChurn(t *testing.T) {
	for _, size := range []int{1, 2, 7, 64} {
		t.Run(fmt.Sprintf("table size %d", size), func(t *testing.T) {
			l, clock := newTestClientLimiter(t, ClientLimiterConfig{Rate: 1, Burst: 1, TableSize: size}, 2)
			for i := range 5000 {
				if i%3 == 0 {
					clock.Advance(time.Second) // every bucket full again: new prefixes evict
				}
				// Few distinct prefixes, so old ones come back and find their slot.
				addr := netip.AddrFrom4([4]byte{127, 0, byte(i % 7), byte((i * 37) % 97)})
				l.Allow(addr)
				checkClientTable(t, l)
			}
			if l.Evictions() == 0 {
				t.Fatal("no evictions: the churn did not churn")
			}
		})
	}
}

func checkClientTable(t *testing.T, l *ClientLimiter) {
	t.Helper()
	seen := make(map[uint64]bool)
	used := 0
	for si := range l.shards {
		s := &l.shards[si]
		s.mu.Lock()
		for i := range s.slots {
			fp, tat := s.slots[i].fp.Load(), s.slots[i].tat.Load()
			if tat == giving {
				t.Fatalf("shard %d slot %d left marked giving", si, i)
			}
			if fp == 0 {
				continue
			}
			used++
			if seen[fp] {
				t.Fatalf("prefix %#x held twice", fp)
			}
			seen[fp] = true
			f1, f2 := s.groupsOf(fp)
			if i, _ := bits.Mul64(fp, uint64(len(l.shards))); &l.shards[i] != s {
				t.Fatalf("prefix %#x in shard %d, not its own %d", fp, si, i)
			}
			if g := i / s.ways; g != f1 && g != f2 {
				t.Fatalf("prefix %#x in shard %d slot %d, outside its groups", fp, si, i)
			}
		}
		s.mu.Unlock()
	}
	if size := l.Len(); used != size || size > l.Config().TableSize {
		t.Fatalf("%d slots in use, Len %d, table size %d", used, size, l.Config().TableSize)
	}
}

// TestClientLimiterConcurrentGiving checks the lock-free token against slots
// changing hands (clienttable.go) with an exact count. One group of 8 slots,
// 24 prefixes asking from 4 goroutines, on a manual clock that moves only
// between phases, by a whole burst's refill: in each phase every bucket
// starts full, new prefixes evict full buckets (never one that gave a token
// in the phase: it is busy until the next), and the rest share the overflow
// bucket. So a phase admits at most (8 + 1) × burst, whatever the
// interleaving; a token taken from a bucket that was being given away and
// then lost would show as one more.
func TestClientLimiterConcurrentGiving(t *testing.T) {
	const (
		burst      = 3
		slots      = 8
		prefixes   = 24
		goroutines = 4
		phases     = 300
		asks       = 60 // per goroutine and phase
	)
	l, clock := newTestClientLimiter(t, ClientLimiterConfig{Rate: 1000, Burst: burst, TableSize: slots}, 1)
	addrs := make([]netip.Addr, prefixes)
	for i := range addrs {
		addrs[i] = netip.AddrFrom4([4]byte{127, 0, 2, byte(i)})
	}
	evictions := l.Evictions()
	for phase := range phases {
		clock.Advance(burst * time.Millisecond)
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range asks {
					if l.Allow(addrs[(i*5+g*7+phase)%prefixes]) {
						admitted.Add(1)
					}
				}
			}()
		}
		waitGroupWithin(t, &wg, time.Minute)
		if n := admitted.Load(); n > (slots+1)*burst || n == 0 {
			t.Fatalf("phase %d admitted %d, want 1..%d", phase, n, (slots+1)*burst)
		}
		checkClientTable(t, l)
	}
	if l.Evictions() == evictions {
		t.Fatal("no slot changed hands")
	}
}

// TestClientShardLayout keeps what every check reads on a cache line of its
// own, apart from the lock and counters a flood of new prefixes writes.
func TestClientShardLayout(t *testing.T) {
	var s clientShard
	if size := unsafe.Sizeof(s); size != 128 {
		t.Fatalf("clientShard is %d bytes, want 128 (two cache lines)", size)
	}
	if off := unsafe.Offsetof(s.mu); off != 64 {
		t.Fatalf("the lock is at byte %d, want 64: the second line", off)
	}
	if end := unsafe.Offsetof(s.groups) + unsafe.Sizeof(s.groups); end > 64 {
		t.Fatalf("what a check reads ends at byte %d, past the first line", end)
	}
	if size := unsafe.Sizeof(clientSlot{}); size != 16 {
		t.Fatalf("clientSlot is %d bytes, want 16 (a group of 8 is two cache lines)", size)
	}
}

// The interval between tokens is 1/rate rounded up to whole nanoseconds, so
// the rate is never exceeded: at 3e8 a second, 1/rate is 3.33 ns, and a
// prefix asking every nanosecond for 1 ms gets at most burst + rate × 1 ms.
// (Rounded down, to 3 ns, it got a ninth more.)
func TestClientLimiterIntervalRoundsUp(t *testing.T) {
	const rate, burst, span = 3e8, 1, 1_000_000 // span in ns
	l, _ := newTestClientLimiter(t, ClientLimiterConfig{Rate: rate, Burst: burst}, 1)
	addr := netip.MustParseAddr("127.0.0.1")
	admitted := 0
	for ns := range span + 1 {
		if l.AllowAt(t0.Add(time.Duration(ns)), addr) {
			admitted++
		}
	}
	if bound := burst + rate*span/1e9; float64(admitted) > bound {
		t.Fatalf("asked every ns for %v at %g/s, burst %d: %d admitted, more than burst + rate × elapsed = %.0f",
			time.Duration(span), rate, burst, admitted, bound)
	}
}
