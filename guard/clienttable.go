package guard

// One shard of the per-client table: a fixed array of slots, allocated once,
// cut into groups of clientWays slots. A prefix may live in one of two
// groups, both chosen by its hash (two choices keep the groups evenly
// filled), so finding it, making room for it and evicting for it look at no
// more than 16 slots, whatever the traffic: no probe chains, no rehashing,
// no allocation after construction.
//
// A new prefix takes an empty slot of the emptier of its groups; with none,
// the slot of the bucket in either group that has been full the longest
// (the lowest tat at or before now); with none, no slot: its groups are
// full of busy buckets and it goes to the overflow bucket.
//
// A slot is 16 bytes, the prefix's fingerprint and its bucket's tat, and a
// group of eight is two 64-byte cache lines: a check reads the four lines of
// its groups, which the processor fetches together, and nothing else. (With
// the prefix itself in each slot, 24 bytes, a check read a word of tags and
// then the one slot they pointed to: two fetches, one after the other, each
// a miss in a table of megabytes. With groups of four, one line each, a
// table filled with busy prefixes sent its first new one to the overflow
// bucket half full instead of three quarters.)
//
// The fingerprint is the prefix's seeded 64-bit hash, never 0, which marks
// an empty slot. Two prefixes with the same fingerprint would share one
// bucket: each gets less, never more, and no one can aim at another's
// fingerprint without the seed (and whoever can send from a victim's
// address drains its bucket more simply by doing so).
//
// Taking a token takes no lock. A check finds its fingerprint in one of the
// sixteen slots and moves the slot's tat forward with a compare-and-swap; the
// shard's lock is taken only to give a slot to a prefix, which is when a
// slot's fingerprint changes. That rests on two rules:
//
//   - A slot's tat only ever grows, across owners too. A token moves it
//     forward (admit), and a slot given away starts its new bucket later
//     than the evicted one ended (the floor; see place). The one exception
//     is a slot marked for eviction and put back, its owner unchanged, with
//     the tat it had. So a tat read and then found unchanged by a
//     compare-and-swap, or by a second read, belongs to the same bucket
//     throughout, in the same state.
//   - Giving a slot away marks its tat giving first, then writes the new
//     fingerprint, then the new tat. A check that reads its tat and then its
//     fingerprint, and acts only if the tat is unchanged afterwards, sees
//     either the old owner's bucket whole or the new one's whole: never a
//     tat of one with the fingerprint of the other.

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
)

// clientWays is how many slots a group holds: two cache lines of them.
const clientWays = 8

// giving marks a slot's tat while the slot is being given to a prefix: a
// check that finds it goes to the shard's lock. No reading reaches it
// (clampReading).
const giving = math.MinInt64

// clientSlot is one prefix, by its fingerprint, and its bucket, kept as its
// tat (see clients.go).
type clientSlot struct {
	fp  atomic.Uint64 // the prefix's fingerprint; 0: the slot is empty
	tat atomic.Int64
}

// clientShard is one lock's worth of the table. Its first cache line is
// read by every check and written once; the second is written when a slot
// changes hands or a prefix overflows, so a flood of new prefixes does not
// take the first from the other cores.
type clientShard struct {
	slots  []clientSlot // groups of ways slots, one after the other
	ways   int
	groups int
	_      [24]byte

	mu    sync.Mutex // held to give a slot to a prefix; a token takes no lock
	floor int64      // the latest tat of a bucket evicted from this shard; guarded by mu

	// Read without the lock by Len, Evictions and Overflows.
	size      atomic.Int64
	evictions atomic.Uint64
	overflows atomic.Uint64

	_ [24]byte
}

// init makes s an empty shard of groups groups of ways slots, 1 <= ways <=
// clientWays.
func (s *clientShard) init(groups, ways int) {
	s.slots = make([]clientSlot, groups*ways) // a table of any size starts a cache line
	s.ways, s.groups, s.floor = ways, groups, noFloor
}

// noFloor is a tat older than any reading: the floor of a shard that has
// evicted nothing yet.
const noFloor = math.MinInt64 + 1

// groupsOf returns the two groups of a prefix whose fingerprint is fp. The
// shard was chosen by the fingerprint's top bits; each group by bits further
// down, so the three choices are independent.
func (s *clientShard) groupsOf(fp uint64) (int, int) {
	g1, _ := bits.Mul64(bits.RotateLeft64(fp, 21), uint64(s.groups))
	g2, _ := bits.Mul64(bits.RotateLeft64(fp, 42), uint64(s.groups))
	return int(g1), int(g2)
}

// group returns the slots of group g.
func (s *clientShard) group(g int) []clientSlot {
	return s.slots[g*s.ways : (g+1)*s.ways]
}

// find returns the slot holding fp in group g1 or g2, or nil. The second
// group's slots are read before the first's are all compared (the processor
// runs ahead past compares it predicts to fail), so that when the groups miss
// the cache their fetches wait together.
func (s *clientShard) find(g1, g2 int, fp uint64) *clientSlot {
	a, b := s.group(g1), s.group(g2)
	for i := range a {
		if a[i].fp.Load() == fp {
			return &a[i]
		}
	}
	for i := range b {
		if b[i].fp.Load() == fp {
			return &b[i]
		}
	}
	return nil
}

// take takes a token from the bucket in sl, which held fp's bucket when
// found, once st admits too, and reports whether it did. held is false, and
// nothing taken, when sl no longer holds fp's bucket or is being given to a
// prefix: the caller then looks again under the shard's lock. It takes no
// lock of its own (st's bucket takes its mutex).
func (l *ClientLimiter) take(sl *clientSlot, fp uint64, now int64, st *sharedTake) (ok, held bool) {
	for {
		tat := sl.tat.Load()
		if tat == giving || sl.fp.Load() != fp {
			return false, false
		}
		next, ok := l.admit(tat, now)
		if !ok {
			if sl.tat.Load() == tat { // the bucket read was fp's throughout
				return false, true
			}
			continue
		}
		if !st.admit() { // fp's bucket would admit; the shared one refuses
			return false, true
		}
		if sl.tat.CompareAndSwap(tat, next) {
			return true, true
		}
		// Another check took a token, or the slot was given away: again.
	}
}

// place gives fp a slot in group g1 or g2, as the head comment says, and
// takes a token from its new bucket once st admits too. room is false when
// there is no slot to give. A query st refuses changes nothing: the empty
// slot stays empty, the bucket chosen for eviction keeps its slot. It
// requires that s.mu is held.
func (s *clientShard) place(l *ClientLimiter, g1, g2 int, fp uint64, now int64, st *sharedTake) (room, ok bool) {
	a, b := s.group(g1), s.group(g2)
	var sl *clientSlot
	if e1, e2 := empties(a), empties(b); e1 > 0 && e1 >= e2 {
		sl = firstEmpty(a)
	} else if e2 > 0 {
		sl = firstEmpty(b)
	}
	if sl != nil {
		if s.sharedRefuses(l, now, st) {
			return true, false
		}
		s.size.Add(1)
		sl.tat.Store(giving) // no check can hold it (fingerprint 0); this keeps it so
		return true, s.give(l, sl, fp, now)
	}
	// Evict. A check may take a token from the chosen bucket meanwhile, so
	// the slot is marked giving first and its tat seen as it was then: still
	// full at now, it goes; busy now, it is put back as it was (its owner never
	// changed, so a check that read that tat before may still swap it) and
	// the choice is made again. A bucket busy at now stays busy, so that
	// happens at most once per slot. (A compare-and-swap with the tat seen
	// when choosing failed again and again when checks with older readings
	// kept taking tokens from a bucket that stayed full, and sent the new
	// prefix to the overflow bucket beside a bucket it could take.)
	for range 2*s.ways + 1 {
		victim, least := oldest(a, now)
		if v, t := oldest(b, now); v != nil && (victim == nil || t < least) {
			victim = v
		}
		if victim == nil {
			return false, false
		}
		tat := victim.tat.Swap(giving)
		if tat > now || s.sharedRefuses(l, now, st) {
			victim.tat.Store(tat) // put back as it was, as for a busy bucket
			if tat > now {
				continue
			}
			return true, false
		}
		s.floor = max(s.floor, tat)
		s.evictions.Add(1)
		return true, s.give(l, victim, fp, now)
	}
	return false, false
}

// sharedRefuses reports whether st refuses a query that a new bucket, given
// a slot at now, would admit: then no slot is given. (The floor a victim
// raises is at most now, so start is the same before and after an eviction.)
// It requires that s.mu is held.
func (s *clientShard) sharedRefuses(l *ClientLimiter, now int64, st *sharedTake) bool {
	_, ok := l.admit(max(now, s.floor), now)
	return ok && !st.admit()
}

// give hands sl, marked giving, to fp with a full bucket, full from now or
// from the floor if that is later, and takes a token from it. The new tat is
// later than the evicted bucket's: the floor is at least that, and a token
// taken moves it on (a bucket starting at the floor, after now, is refused
// only if it is still more than a burst ahead of now, so later still). It
// requires that s.mu is held.
func (s *clientShard) give(l *ClientLimiter, sl *clientSlot, fp uint64, now int64) bool {
	start := max(now, s.floor)
	next, ok := l.admit(start, now)
	sl.fp.Store(fp)
	sl.tat.Store(next) // admit returns start unchanged when it refuses
	return ok
}

// empties returns how many slots of g are empty.
func empties(g []clientSlot) int {
	n := 0
	for i := range g {
		if g[i].fp.Load() == 0 {
			n++
		}
	}
	return n
}

// firstEmpty returns the first empty slot of g, or nil.
func firstEmpty(g []clientSlot) *clientSlot {
	for i := range g {
		if g[i].fp.Load() == 0 {
			return &g[i]
		}
	}
	return nil
}

// oldest returns the slot of g holding the bucket full the longest at now
// (the first of equals) and its tat, or nil when every bucket there is still
// refilling. The slots of g are all taken.
func oldest(g []clientSlot, now int64) (*clientSlot, int64) {
	var found *clientSlot
	var least int64
	for i := range g {
		if tat := g[i].tat.Load(); tat != giving && tat <= now && (found == nil || tat < least) {
			found, least = &g[i], tat
		}
	}
	return found, least
}
