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

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
)

// clientWays is how many slots a group holds.
const clientWays = 8

// emptySlot is the tat of a slot that holds no prefix; no reading is this old.
const emptySlot = math.MinInt64

// clientSlot is one prefix and its bucket, kept as its tat (see clients.go).
type clientSlot struct {
	key clientKey
	tat int64
}

// clientShard is one lock's worth of the table.
type clientShard struct {
	mu     sync.Mutex
	slots  []clientSlot // groups of ways slots, one after the other
	ways   int
	groups int
	floor  int64 // the latest tat of a bucket evicted from this shard

	// Read without the lock by Len, Evictions and Overflows.
	size      atomic.Int64
	evictions atomic.Uint64
	overflows atomic.Uint64

	_ [64]byte // keeps the next shard's lock off this shard's cache lines
}

// init makes s an empty shard of groups groups of ways slots.
func (s *clientShard) init(groups, ways int) {
	s.slots = make([]clientSlot, groups*ways)
	for i := range s.slots {
		s.slots[i].tat = emptySlot
	}
	s.ways, s.groups, s.floor = ways, groups, emptySlot
}

// groupsOf returns the first slot of each of the two groups of a prefix
// whose seeded hash is hash. The shard was chosen by the hash's top bits;
// each group by bits further down, so the three choices are independent.
func (s *clientShard) groupsOf(hash uint64) (int, int) {
	g1, _ := bits.Mul64(bits.RotateLeft64(hash, 21), uint64(s.groups))
	g2, _ := bits.Mul64(bits.RotateLeft64(hash, 42), uint64(s.groups))
	return int(g1) * s.ways, int(g2) * s.ways
}

// groupScan is what one pass over a group finds.
type groupScan struct {
	found  int // the prefix's slot, or -1
	empty  int // an empty slot, or -1
	free   int // how many slots are empty
	oldest int // the bucket full the longest at now, or -1
}

// scan looks at the group starting at slot first for key, for room and for
// a full bucket. It requires that s.mu is held.
func (s *clientShard) scan(first int, key clientKey, now int64) groupScan {
	r := groupScan{found: -1, empty: -1, oldest: -1}
	for i := first; i < first+s.ways; i++ {
		switch slot := &s.slots[i]; {
		case slot.tat == emptySlot:
			r.free++
			if r.empty < 0 {
				r.empty = i
			}
		case slot.key == key:
			r.found = i
			return r
		case slot.tat <= now && (r.oldest < 0 || slot.tat < s.slots[r.oldest].tat):
			r.oldest = i
		}
	}
	return r
}

// slotFor returns the slot of key's bucket, giving it one if it has none,
// or -1 when both its groups are full of busy buckets. It requires that
// s.mu is held.
func (s *clientShard) slotFor(key clientKey, hash uint64, now int64) int {
	first1, first2 := s.groupsOf(hash)
	a := s.scan(first1, key, now)
	if a.found >= 0 {
		return a.found
	}
	b := a
	if first2 != first1 {
		if b = s.scan(first2, key, now); b.found >= 0 {
			return b.found
		}
	}
	switch {
	case a.free > 0 && a.free >= b.free:
		s.size.Add(1)
		return s.put(a.empty, key, now)
	case b.free > 0:
		s.size.Add(1)
		return s.put(b.empty, key, now)
	}
	victim := a.oldest
	if victim < 0 || (b.oldest >= 0 && s.slots[b.oldest].tat < s.slots[victim].tat) {
		victim = b.oldest
	}
	if victim < 0 {
		return -1
	}
	s.floor = max(s.floor, s.slots[victim].tat)
	s.evictions.Add(1)
	return s.put(victim, key, now)
}

// put gives slot i to key with a full bucket, full from now or from the
// floor if that is later: a bucket re-created after an eviction never starts
// before the evicted one ended. It requires that s.mu is held.
func (s *clientShard) put(i int, key clientKey, now int64) int {
	s.slots[i] = clientSlot{key: key, tat: max(now, s.floor)}
	return i
}
