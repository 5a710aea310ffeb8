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
// It is open addressing over a table of slots, each an entry and its hash
// side by side (16 bytes, four to a cache line), so a probe compares
// hashes without reading the entries it passes. A hash starts at the slot
// its top bits name, the high word of hash × slots (its low bits chose
// the shard, so they are the same for every entry here), and probes
// linearly, wrapping at the end.
//
// A slot's life in one table: empty (no hash, no entry); then its hash is
// written, once, and then its entry; a later entry of the same hash
// replaces that entry in place; an evicted entry leaves a tombstone, which
// only an entry of the same hash may take again. So a hash has at most one
// slot in a table, a slot's hash never changes once it holds an entry, and
// a reader that finds its hash in a slot finds in it an entry of that
// hash, a tombstone, or (while the slot is being filled) nothing yet. A
// reader stops at the first slot with no entry: every slot from a hash's
// start to where it lay held something when it was put there, and no slot
// is ever emptied.
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
// entry (EntryOverhead): a rebuilt table has twice as many slots as live
// entries (load 1/2), at least minSlots; it is rebuilt when an insert
// would fill more than 3/4 of it with entries and tombstones, and when a
// removal leaves its load under 2/5. So beyond minSlots its load is never
// under 2/5, and a table costs at most 5/2 slots, 40 bytes, per entry; the
// minSlots table is reserved up front. A rebuild moves every live entry,
// and the next one is a quarter of the table's inserts away, or a tenth
// of its removals: O(1) slots moved per insert or removal, amortized. The
// table a rebuild replaces is garbage once no reader holds it.

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
}

func newTable(n int) *table { return &table{slots: make([]slot, n)} }

// start returns the slot where h's probe starts.
func (t *table) start(h uint64) int {
	i, _ := bits.Mul64(h, uint64(len(t.slots)))
	return int(i)
}

// next returns the slot after i, the first after the last.
func (t *table) next(i int) int {
	if i++; i == len(t.slots) {
		return 0
	}
	return i
}

// find returns the entry indexed under h, or nil. It takes no lock and
// writes nothing; see the head comment for what it may miss or find. Its
// probe ends, as every table keeps a quarter of its slots empty.
func (s *shard) find(h uint64) *entry {
	t := s.tab.Load()
	for i := t.start(h); ; i = t.next(i) {
		sl := &t.slots[i]
		if sl.hash.Load() == h {
			if e := sl.e.Load(); e != tombstone {
				return e // nil: the slot is being filled, or empty and h is 0
			}
		} else if sl.e.Load() == nil {
			return nil
		}
	}
}

// index puts e in the index under e.hash, in place of the entry indexed
// there, which it returns (nil if none). It requires that s.mu is held.
func (s *shard) index(e *entry) *entry {
	t := s.tab.Load()
	var grave *slot // the tombstone of e's hash on the way
	i := t.start(e.hash)
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
			grave = sl
		}
		i = t.next(i)
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
	i := t.start(e.hash)
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
		i = t.next(i)
	}
	if len(t.slots) > minSlots && 5*s.live < 2*len(t.slots) {
		s.rebuild(nil)
	}
}

// rebuild publishes a new table of the live entries, and of e if not nil,
// sized for them: no tombstones, load 1/2. It requires that s.mu is held
// and that s.live counts e.
func (s *shard) rebuild(e *entry) {
	t := newTable(max(minSlots, 2*s.live))
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
	i := t.start(e.hash)
	for t.slots[i].e.Load() != nil {
		i = t.next(i)
	}
	t.slots[i].hash.Store(e.hash)
	t.slots[i].e.Store(e)
}
