package guard

// The per-client gate, as the chapter states it:
//
//   - A client is its address cut to a prefix: the first V4Len bits of an
//     IPv4 address (default 32), the first V6Len bits of an IPv6 one
//     (default 64, one site's network). An IPv4-mapped IPv6 address is IPv4.
//   - Each prefix has its own token bucket: Rate tokens per second, at most
//     Burst, starting full. Allow takes one token or refuses, taking none.
//   - The table holds at most TableSize prefixes. A bucket that has refilled
//     to its burst holds nothing a new bucket would not, so a new prefix
//     that finds no empty slot takes the slot of a full bucket, the one
//     full (idle) the longest: nothing is lost.
//   - A bucket still refilling is never evicted. A new prefix that finds
//     every slot it could take busy shares ONE overflow bucket, with the
//     same rate and burst, with every other prefix that found no room. So a
//     flood from cycling source addresses resets no one's bucket and gets
//     no fresh burst per source: to keep the table busy it must spend
//     TableSize × Rate queries per second itself.
//   - Exempt prefixes skip the gate: Allow reports true and touches nothing.
//
// Each bucket is kept as one number, its tat: the time at which it will be
// full again. At time now it holds burst − (tat − now)×rate tokens (burst
// once tat ≤ now). Allow admits when tat − now ≤ (burst−1)/rate and then
// moves tat to max(tat, now) + 1/rate. This is the token bucket of
// TokenBucket in a form where "full" is one comparison and time only moves
// forward, which settles the hazard of readings taken outside the lock:
//
//   - A reading is stale by the time the lock is held, and an older reading
//     may be applied after a newer one. An older reading finds fewer tokens
//     and never moves tat back, so no interval is ever counted twice; a
//     clock that steps back likewise mints nothing.
//   - The same holds across an eviction: a new bucket starts full at the
//     later of its reading and the latest tat evicted from its shard, so a
//     prefix evicted and re-created under a stale reading earns nothing twice.
//   - Hence the bound the tests check: a prefix is admitted from the table
//     at most burst + rate × (t − t0) times between readings t0 and t, and
//     the overflow bucket adds at most as much for all prefixes together.
//
// Cost: the table is split over 64 shards by a seeded hash of the prefix,
// each with its slots allocated up front; within a shard a prefix may live
// in 16 slots, four cache lines (clienttable.go). A check reads those four
// lines, fetched together, and takes its token with one compare-and-swap, no
// lock; only giving a slot to a new prefix takes the shard's lock. Allow
// allocates nothing and never looks at more than those 16 slots.

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"sync/atomic"
	"time"
)

// ZeroBits, as V4Len or V6Len, asks for a prefix of length 0: every address
// of that family is one client. (The zero value of those fields means the
// default length.)
const ZeroBits = -1

// defaultClientShards is how many locks the table is split over.
const defaultClientShards = 64

// maxBucketSpan is the longest burst/rate a bucket may take to refill, so
// that tat arithmetic on clamped readings cannot overflow.
const maxBucketSpan = 100 * 365 * 24 * time.Hour

// ClientLimiterConfig sets a ClientLimiter's rules. A zero field takes its
// default; Rate has none and must be set.
type ClientLimiterConfig struct {
	Rate      float64        // tokens per second for each prefix, > 0
	Burst     int            // tokens a prefix may spend at once, >= 1 (default Rate rounded up)
	V4Len     int            // leading bits naming an IPv4 client, 1..32 or ZeroBits (default 32)
	V6Len     int            // leading bits naming an IPv6 client, 1..128 or ZeroBits (default 64)
	TableSize int            // most prefixes held at once, >= 1, used in groups of 8 (default 100,000)
	Exempt    []netip.Prefix // clients that skip the gate (none by default)
}

// ClientLimiter is a table of token buckets, one per client prefix, with a
// bounded size. It is safe for concurrent use. Build it with NewClientLimiter.
type ClientLimiter struct {
	shards []clientShard
	seed   [3]uint64 // secret, so no one can aim prefixes at one group
	mask4  prefixMask
	mask6  prefixMask
	exempt *AccessList // nil when nothing is exempt

	interval  int64 // nanoseconds per token: 1/rate, rounded up so the rate is never exceeded
	tolerance int64 // (burst−1) × interval: how far tat may run ahead of now and still admit

	epoch time.Time // readings are nanoseconds since this one
	clock Clock
	real  bool // clock is RealClock: read the monotonic clock directly

	cfg ClientLimiterConfig

	_        [64]byte
	overflow atomic.Int64 // the overflow bucket's tat; every prefix without a slot shares it
	_        [64]byte
}

// NewClientLimiter returns an empty table with cfg's rules (zero fields take
// their defaults), reading time from c (RealClock{} in production). Every
// slot is allocated here: 16 bytes per TableSize entry.
// It panics on a configuration that cannot work; callers validate first.
func NewClientLimiter(cfg ClientLimiterConfig, c Clock) *ClientLimiter {
	return newClientLimiter(cfg, c, defaultClientShards, clientWays)
}

// newClientLimiter is NewClientLimiter with the number of shards and the
// slots per group chosen; tests use them to place prefixes where they want.
func newClientLimiter(cfg ClientLimiterConfig, c Clock, shards, ways int) *ClientLimiter {
	if !(cfg.Rate > 0) {
		panic(fmt.Sprintf("guard: client rate must be > 0, got %v", cfg.Rate))
	}
	if cfg.Burst == 0 {
		cfg.Burst = max(1, int(math.Min(math.Ceil(cfg.Rate), math.MaxInt32)))
	}
	if cfg.V4Len == 0 {
		cfg.V4Len = 32
	}
	if cfg.V6Len == 0 {
		cfg.V6Len = 64
	}
	if cfg.TableSize == 0 {
		cfg.TableSize = 100_000
	}
	interval := max(1, math.Ceil(float64(time.Second)/cfg.Rate)) // converted once known to fit
	switch {
	case cfg.Burst < 1:
		panic(fmt.Sprintf("guard: client burst must be >= 1, got %d", cfg.Burst))
	case cfg.V4Len < ZeroBits || cfg.V4Len > 32:
		panic(fmt.Sprintf("guard: client IPv4 prefix length must be 1..32 or ZeroBits, got %d", cfg.V4Len))
	case cfg.V6Len < ZeroBits || cfg.V6Len > 128:
		panic(fmt.Sprintf("guard: client IPv6 prefix length must be 1..128 or ZeroBits, got %d", cfg.V6Len))
	case cfg.TableSize < 1:
		panic(fmt.Sprintf("guard: client table size must be >= 1, got %d", cfg.TableSize))
	case float64(cfg.Burst)*interval > float64(maxBucketSpan):
		panic(fmt.Sprintf("guard: client burst/rate must refill within %v, got %d/%v", maxBucketSpan, cfg.Burst, cfg.Rate))
	}
	if c == nil {
		c = RealClock{}
	}
	_, real := c.(RealClock)
	l := &ClientLimiter{
		seed:      [3]uint64{rand.Uint64(), rand.Uint64(), rand.Uint64() | 1},
		mask4:     v4Mask(max(cfg.V4Len, 0)),
		mask6:     v6Mask(max(cfg.V6Len, 0)),
		interval:  int64(interval),
		tolerance: int64(cfg.Burst-1) * int64(interval),
		epoch:     c.Now(),
		clock:     c,
		real:      real,
		cfg:       cfg,
	}
	if len(cfg.Exempt) > 0 {
		l.exempt = NewAccessList(cfg.Exempt...)
	}
	// Groups of ways slots, as many as TableSize holds, dealt out to the shards.
	ways = min(ways, cfg.TableSize)
	groups := cfg.TableSize / ways
	n := min(shards, groups)
	l.shards = make([]clientShard, n)
	for i := range l.shards {
		g := groups / n
		if i < groups%n {
			g++
		}
		l.shards[i].init(g, ways)
	}
	return l
}

// Config returns the limiter's rules with the defaults filled in.
func (l *ClientLimiter) Config() ClientLimiterConfig { return l.cfg }

// Allow takes one token from the bucket of addr's prefix and reports whether
// it did. An exempt addr is allowed without touching the table. The zero Addr
// names no prefix and shares the overflow bucket. It does not allocate.
func (l *ClientLimiter) Allow(addr netip.Addr) bool {
	if l.exempt != nil && l.exempt.Contains(addr) {
		return true
	}
	return l.allow(addr, l.now(), nil)
}

// AllowAt is Allow with the clock read by the caller, who may read it once
// for a batch of queries. A reading older than one already applied is
// handled as a stale one: it finds fewer tokens and changes nothing back.
func (l *ClientLimiter) AllowAt(now time.Time, addr netip.Addr) bool {
	if l.exempt != nil && l.exempt.Contains(addr) {
		return true
	}
	return l.allow(addr, clampReading(now.Sub(l.epoch)), nil)
}

// allow is Allow at a reading in nanoseconds since the epoch. With st, a
// token is taken from the client's bucket only once st admits too
// (clientshared.go); nil: the client's bucket alone.
func (l *ClientLimiter) allow(addr netip.Addr, now int64, st *sharedTake) bool {
	k, ok := l.keyOf(addr)
	if !ok {
		l.shards[0].overflows.Add(1)
		return l.allowOverflow(now, st)
	}
	s, fp := l.shardOf(k)
	g1, g2 := s.groupsOf(fp)
	if sl := s.find(g1, g2, fp); sl != nil {
		if ok, held := l.take(sl, fp, now, st); held {
			return ok
		}
	}
	// A new prefix, or one whose slot was being given away: under the lock,
	// where no slot changes hands, look again and give it one if it has none.
	s.mu.Lock()
	if sl := s.find(g1, g2, fp); sl != nil {
		ok, _ := l.take(sl, fp, now, st) // held: only the lock's holder gives slots away
		s.mu.Unlock()
		return ok
	}
	room, ok := s.place(l, g1, g2, fp, now, st)
	s.mu.Unlock()
	if !room {
		s.overflows.Add(1)
		return l.allowOverflow(now, st)
	}
	return ok
}

// keyOf returns addr cut to its prefix; ok is false for the zero Addr.
//
// A link-local address names a host only together with its zone, the
// interface it came in on: fe80::1 on one link and on another are two
// hosts. So the zone's hash replaces bits 16–47 of such a key, which are 0
// in every link-local address in use (fe80::/64), before it is cut: with a
// prefix of /48 or longer each link has its own buckets; one of /16 or
// shorter, as it asks, joins them. (Without this, one link-local host that
// spent its bucket refused every link-local client of every other link:
// TestAttackLinkLocalClientsOnTwoLinksHaveTheirOwnBuckets.) Replaced, not XORed
// in: a host chooses those bits of its own address, and with a XOR one on
// link 2 that took fe80:0:h(2)^h(3)::1 had the key of fe80::1 on link 3, a
// bucket on a network it cannot send from
// (TestAttackLinkLocalHostAimsAtAnotherLinksBucket). The rest of the
// first 64 bits goes too: a host chooses bits 10–15 (fe80::/10 is
// link-local) and 48–63 of its address as freely, and with them, at /64, it
// had a fresh bucket for each of 2^22 addresses on one link
// (TestAttackLinkLocalHostSpreadsOverBitsItChooses). So the first 64 bits
// of a link-local key are fe80, the zone's hash, 0: the link is the
// network. The access list, which matches configured prefixes, keeps the
// address as it is.
func (l *ClientLimiter) keyOf(addr netip.Addr) (k clientKey, ok bool) {
	k, is4, ok := addrKey(addr)
	if is4 {
		return k.masked(l.mask4), ok
	}
	if addr.IsLinkLocalUnicast() {
		k.hi = 0xfe80<<48 | uint64(zoneHash(addr.Zone()))<<16
	}
	return k.masked(l.mask6), ok
}

// zoneHash is a zone's name (the interface's index as the server gives
// it, or its name) as 32 bits, FNV-1a. It does not allocate.
func zoneHash(z string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(z); i++ {
		h = (h ^ uint32(z[i])) * 16777619
	}
	return h
}

// shardOf returns the shard of a prefix and the prefix's fingerprint: its
// seeded hash, never 0, which also chooses its groups inside the shard.
func (l *ClientLimiter) shardOf(k clientKey) (*clientShard, uint64) {
	fp := mix(mix(k.hi^l.seed[0], k.lo^l.seed[1]), l.seed[2]) | 1
	i, _ := bits.Mul64(fp, uint64(len(l.shards)))
	return &l.shards[i], fp
}

// mix folds the 128-bit product of a and b into 64 bits, each bit of the
// result depending on most bits of both: two rounds of it, keyed by the
// seed, spread prefixes over shards and groups and fingerprint them, as a
// general-purpose hash would, in a few instructions.
func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// allowOverflow takes a token from the shared overflow bucket, once st
// admits too. It needs no lock: the bucket is one number, swapped only if no
// one changed it meanwhile.
func (l *ClientLimiter) allowOverflow(now int64, st *sharedTake) bool {
	for {
		tat := l.overflow.Load()
		next, ok := l.admit(tat, now)
		if !ok || !st.admit() {
			return false
		}
		if l.overflow.CompareAndSwap(tat, next) {
			return true
		}
	}
}

// admit is the token bucket rule on a bucket's tat: the new tat, and whether
// a token was taken. The new tat is never earlier than the old one.
func (l *ClientLimiter) admit(tat, now int64) (int64, bool) {
	if tat-now > l.tolerance {
		return tat, false
	}
	return max(tat, now) + l.interval, true
}

// now reads the clock outside any lock (the clock can be the slow part).
func (l *ClientLimiter) now() int64 {
	if l.real {
		return clampReading(time.Since(l.epoch)) // the monotonic clock: never steps back
	}
	return clampReading(l.clock.Now().Sub(l.epoch))
}

// clampReading turns a reading since the epoch into nanoseconds, clamped to
// ±2^61 (±73 years) so that tat arithmetic cannot overflow.
func clampReading(d time.Duration) int64 {
	return min(max(int64(d), -1<<61), 1<<61)
}

// Len returns how many prefixes hold a slot in the table: at most TableSize
// (rounded down to a multiple of 8 above 8). A slot is reused, never freed,
// so Len never shrinks.
func (l *ClientLimiter) Len() int {
	n := int64(0)
	for i := range l.shards {
		n += l.shards[i].size.Load()
	}
	return int(n)
}

// Evictions returns how many full buckets have given their slot to a new
// prefix since the limiter was built.
func (l *ClientLimiter) Evictions() uint64 {
	n := uint64(0)
	for i := range l.shards {
		n += l.shards[i].evictions.Load()
	}
	return n
}

// Overflows returns how many Allow calls found no slot for their prefix and
// went to the shared overflow bucket, admitted or not.
func (l *ClientLimiter) Overflows() uint64 {
	n := uint64(0)
	for i := range l.shards {
		n += l.shards[i].overflows.Load()
	}
	return n
}
