package cache

import (
	"math/bits"
	"sync/atomic"
)

// A shard finds its entries by hash in an index that a lookup reads
// without a lock and without writing anything: no read lock whose counter
// every core asking for the same hot names would pull back and forth.
// Writers change it only under the shard's lock, which S3-FIFO's queues
// need anyway.
//
// It is open addressing over a table of slots, a power of two of them,
// each an entry and its hash side by side (16 bytes, four to a cache
// line), so a probe compares hashes without reading the entries it passes.
// A hash starts at the slot its top bits name (its low bits chose the
// shard, so they are the same for every entry here) and probes linearly.
//
// A slot's life in one table: empty (no hash, no entry); then its hash is
// written, once, and then its entry; a later entry of the same hash
// replaces that entry in place; an evicted entry leaves a tombstone, which
// only an entry of the same hash may take again. So within a table a
// slot's hash never changes once it holds an entry, and a reader that
// finds its hash in a slot finds in it an entry of that hash, a tombstone,
// or (while the slot is being filled) nothing yet. A reader stops at the
// first slot with no entry: every slot from a hash's start to where it lay
// held something when it was put there, and no slot is ever emptied.
//
// Tombstones are cleared, and the table grown or shrunk, by building a new
// table of the live entries and publishing it with one atomic store. A
// reader still on the old table, or racing a writer on the current one,
// may miss an entry just stored (a miss only forwards the query upstream,
// whose answer is then stored again) or find an entry just replaced or
// evicted: its bytes never change once stored, so it is still a correct
// answer for its key, as it was a moment before. A reader never takes an
// entry for another key: Lookup checks the key in the entry it finds
// (entry.holds), as two keys may share a hash.
//
// The table's size follows its live entries, so the bound can count it per
// entry (EntryOverhead): rebuilt, it is the smallest power of two at least
// minSlots that keeps its load at most 1/2; it is rebuilt when an insert
// would fill more than 3/4 of it with entries and tombstones, and when a
// removal leaves its load under 1/4. So beyond minSlots its load is never
// under 1/4, and a table costs at most 4 slots, 64 bytes, per entry; the
// minSlots table is reserved up front. A rebuild moves every live entry
// and leaves the load between 1/4 and 1/2, so the next one is a quarter of
// the table's inserts away, or comes when removals take the load under
// 1/4: perhaps at once, but then to a table half the size at load 1/2,
// which lasts an eighth of the old size's inserts or removals. So a
// rebuild costs O(1) slots moved per insert or removal, amortized.

// slot is one place in a table: an entry and its hash. Its entry is nil
// while the slot is empty (or its hash just written), tombstone after the
// entry there was removed.
type slot struct {
	hash atomic.Uint64
	e    atomic.Pointer[entry]
}

// slotBytes is what a slot takes.
const slotBytes = 16

// minSlots is the smallest table, a shard's when it holds few entries: 1
// KiB, reserved up front.
const minSlots = 64

// tombstone marks a slot whose entry was removed. Never a real entry.
var tombstone = new(entry)

// table is one array of slots. Once published only its slots change.
type table struct {
	slots []slot
	mask  uint64 // len(slots)-1
	shift uint8  // 64 - log2(len(slots)): a hash's top bits name its first slot
}

func newTable(n int) *table {
	return &table{slots: make([]slot, n), mask: uint64(n - 1), shift: uint8(64 - bits.TrailingZeros(uint(n)))}
}

// find returns the entry indexed under h, or nil. It takes no lock and
// writes nothing; see the head comment for what it may miss or find.
func (s *shard) find(h uint64) *entry {
	t := s.tab.Load()
	i := h >> t.shift
	for range len(t.slots) { // the table is never full: bounded all the same
		sl := &t.slots[i]
		if sl.hash.Load() == h {
			if e := sl.e.Load(); e != tombstone {
				return e // nil: the slot is being filled, or empty and h is 0
			}
		} else if sl.e.Load() == nil {
			return nil
		}
		i = (i + 1) & t.mask
	}
	return nil
}

// index puts e in the index under e.hash, in place of the entry indexed
// there, which it returns (nil if none). It requires that s.mu is held.
func (s *shard) index(e *entry) *entry {
	t := s.tab.Load()
	var grave *slot // the first tombstone of e's hash on the way
	i := e.hash >> t.shift
	for {
		sl := &t.slots[i]
		old := sl.e.Load()
		if old == nil {
			break
		}
		if sl.hash.Load() == e.hash {
			if old != tombstone {
				sl.e.Store(e)
				return old
			}
			if grave == nil {
				grave = sl
			}
		}
		i = (i + 1) & t.mask
	}
	s.live++
	switch {
	case grave != nil:
		grave.e.Store(e)
	case 4*(s.used+1) > 3*len(t.slots):
		s.rebuild(e)
	default:
		sl := &t.slots[i]
		sl.hash.Store(e.hash) // before the entry, so a reader that finds the entry finds its hash
		sl.e.Store(e)
		s.used++
	}
	return nil
}

// unindex takes e out of the index, if it is there still. It requires
// that s.mu is held.
func (s *shard) unindex(e *entry) {
	t := s.tab.Load()
	i := e.hash >> t.shift
	for {
		sl := &t.slots[i]
		old := sl.e.Load()
		if old == nil {
			return
		}
		if old == e {
			sl.e.Store(tombstone)
			s.live--
			break
		}
		i = (i + 1) & t.mask
	}
	if len(t.slots) > minSlots && 4*s.live < len(t.slots) {
		s.rebuild(nil)
	}
}

// rebuild publishes a new table of the live entries, and of e if not nil,
// sized for them: no tombstones, its load at most 1/2. It requires that
// s.mu is held and that s.live counts e.
func (s *shard) rebuild(e *entry) {
	n := minSlots
	for 2*s.live > n {
		n *= 2
	}
	t := newTable(n)
	was := s.tab.Load()
	for i := range was.slots {
		if old := was.slots[i].e.Load(); old != nil && old != tombstone {
			t.put(old)
		}
	}
	if e != nil {
		t.put(e)
	}
	s.used = s.live
	s.tab.Store(t) // readers see the whole table, filled, or the old one
}

// resetIndex publishes an empty table of minSlots. It requires that s.mu
// is held.
func (s *shard) resetIndex() {
	s.tab.Store(newTable(minSlots))
	s.live, s.used = 0, 0
}

// put places e in t, not yet published: in the first empty slot of its
// probe, no entry of its hash being there.
func (t *table) put(e *entry) {
	i := e.hash >> t.shift
	for t.slots[i].e.Load() != nil {
		i = (i + 1) & t.mask
	}
	t.slots[i].hash.Store(e.hash)
	t.slots[i].e.Store(e)
}
