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
// Each group also has one word of tags, a byte per slot: 0 for an empty
// slot, else 8 more bits of the hash of the prefix in it. The tags of the
// whole table take 1 byte per slot (100 KB for 100,000 prefixes), little
// enough to stay in the CPU's cache while the slots (24 bytes each) do not,
// so finding a prefix reads the two tag words and then, nearly always, the
// one slot whose tag matches: one slot fetched from memory instead of up to
// sixteen. A new prefix reads the tags for room, and the slots' tats only
// when both its groups are full and a bucket must be evicted.

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
)

// clientWays is how many slots a group holds: one tag word's worth.
const clientWays = 8

// Tag words are read eight bytes at once. A byte is lane i of a word when
// it sits at bits 8i..8i+7.
const (
	laneLow  = 0x0101010101010101 // 0x01 in every lane
	laneHigh = 0x8080808080808080 // the top bit of every lane
)

// clientSlot is one prefix and its bucket, kept as its tat (see clients.go).
type clientSlot struct {
	key clientKey
	tat int64
}

// clientShard is one lock's worth of the table.
type clientShard struct {
	mu     sync.Mutex
	tags   []uint64     // one word per group: byte i is the tag of slot i, 0 if empty
	slots  []clientSlot // groups of ways slots, one after the other
	ways   int
	lanes  uint64 // the top bit of each lane that names a slot: ways lanes
	groups int
	floor  int64 // the latest tat of a bucket evicted from this shard

	// Read without the lock by Len, Evictions and Overflows.
	size      atomic.Int64
	evictions atomic.Uint64
	overflows atomic.Uint64

	_ [64]byte // keeps the next shard's lock off this shard's cache lines
}

// init makes s an empty shard of groups groups of ways slots, 1 <= ways <= 8.
func (s *clientShard) init(groups, ways int) {
	s.tags = make([]uint64, groups)
	s.slots = make([]clientSlot, groups*ways)
	s.ways, s.groups, s.floor = ways, groups, noFloor
	s.lanes = laneHigh >> (8 * (clientWays - ways))
}

// noFloor is a tat older than any reading: the floor of a shard that has
// evicted nothing yet.
const noFloor = math.MinInt64

// groupsOf returns the two groups of a prefix whose seeded hash is hash.
// The shard was chosen by the hash's top bits; each group by bits further
// down, so the three choices are independent.
func (s *clientShard) groupsOf(hash uint64) (int, int) {
	g1, _ := bits.Mul64(bits.RotateLeft64(hash, 21), uint64(s.groups))
	g2, _ := bits.Mul64(bits.RotateLeft64(hash, 42), uint64(s.groups))
	return int(g1), int(g2)
}

// tagOf returns the tag of a prefix whose seeded hash is hash: bits the
// shard and group choices hardly use, never 0.
func tagOf(hash uint64) uint64 {
	return max(1, hash>>48&0xff)
}

// zeroLanes returns the top bit of every lane of w that is 0, and no other.
func zeroLanes(w uint64) uint64 {
	const low7 = laneHigh - laneLow // 0x7f in every lane
	// A lane's top bit is set in (w&low7)+low7 when its low seven bits are
	// not all 0, in w when its own is: in neither only when the lane is 0.
	// No lane carries into the next.
	return ^((w&low7 + low7) | w | low7)
}

// matching returns the top bit of each lane of group g whose tag is tag.
// It requires that s.mu is held.
func (s *clientShard) matching(g int, tag uint64) uint64 {
	return zeroLanes(s.tags[g]^tag*laneLow) & s.lanes
}

// find returns the slot of key among the lanes of group g in m, or -1.
// It requires that s.mu is held.
func (s *clientShard) find(g int, m uint64, key clientKey) int {
	for ; m != 0; m &= m - 1 {
		if i := g*s.ways + bits.TrailingZeros64(m)/8; s.slots[i].key == key {
			return i
		}
	}
	return -1
}

// slotFor returns the slot of key's bucket, giving it one if it has none,
// or -1 when both its groups are full of busy buckets. It requires that
// s.mu is held.
func (s *clientShard) slotFor(key clientKey, hash uint64, now int64) int {
	g1, g2 := s.groupsOf(hash)
	tag := tagOf(hash)
	// Both tag words are read before either group's slots, so that the
	// two reads, when they miss the cache, wait together.
	m1, m2 := s.matching(g1, tag), s.matching(g2, tag)
	if i := s.find(g1, m1, key); i >= 0 {
		return i
	}
	if g2 != g1 {
		if i := s.find(g2, m2, key); i >= 0 {
			return i
		}
	}
	return s.place(g1, g2, key, tag, now)
}

// place gives a new prefix a slot in group g1 or g2, as the head comment
// says, or returns -1 when there is none to give. It requires that s.mu is
// held.
func (s *clientShard) place(g1, g2 int, key clientKey, tag uint64, now int64) int {
	empty1 := zeroLanes(s.tags[g1]) & s.lanes
	empty2 := zeroLanes(s.tags[g2]) & s.lanes
	switch free1, free2 := bits.OnesCount64(empty1), bits.OnesCount64(empty2); {
	case free1 > 0 && free1 >= free2:
		s.size.Add(1)
		return s.put(g1*s.ways+bits.TrailingZeros64(empty1)/8, key, tag, now)
	case free2 > 0:
		s.size.Add(1)
		return s.put(g2*s.ways+bits.TrailingZeros64(empty2)/8, key, tag, now)
	}
	victim := s.oldest(g1, now)
	if o := s.oldest(g2, now); o >= 0 && (victim < 0 || s.slots[o].tat < s.slots[victim].tat) {
		victim = o
	}
	if victim < 0 {
		return -1
	}
	s.floor = max(s.floor, s.slots[victim].tat)
	s.evictions.Add(1)
	return s.put(victim, key, tag, now)
}

// oldest returns the slot of group g, whose slots are all taken, holding the
// bucket full the longest at now (the first of equals), or -1 when every
// bucket there is still refilling. It requires that s.mu is held.
func (s *clientShard) oldest(g int, now int64) int {
	found := -1
	for i := g * s.ways; i < (g+1)*s.ways; i++ {
		if tat := s.slots[i].tat; tat <= now && (found < 0 || tat < s.slots[found].tat) {
			found = i
		}
	}
	return found
}

// put gives slot i to key, whose tag is tag, with a full bucket, full from
// now or from the floor if that is later: a bucket re-created after an
// eviction never starts before the evicted one ended. It requires that s.mu
// is held.
func (s *clientShard) put(i int, key clientKey, tag uint64, now int64) int {
	g, lane := i/s.ways, i%s.ways
	s.tags[g] = s.tags[g]&^(0xff<<(8*lane)) | tag<<(8*lane)
	s.slots[i] = clientSlot{key: key, tat: max(now, s.floor)}
	return i
}
