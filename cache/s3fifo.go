package cache

import "math/bits"

// Eviction is S3-FIFO (Yang et al., "FIFO queues are all you need for cache
// eviction", SOSP 2023), weighed in bytes, one instance per shard:
//
//   - A new entry goes to the small queue, a tenth of the shard's bytes;
//     one whose hash is in the ghost table (it was evicted from the small
//     queue lately) goes straight to the main queue.
//   - A hit only raises the entry's frequency, at most to 3: it moves
//     nothing, so a lookup needs no write lock.
//   - To make room: while the small queue holds more than its tenth, its
//     oldest entry leaves it — to the main queue if it was hit since it came
//     (its frequency is reset), else out, its hash remembered in the ghost
//     table. Otherwise the main queue's oldest entry is evicted, unless its
//     frequency is above 0: then it goes back to the front with one less.
//   - An entry past its stale window is evicted whatever its frequency.
//
// Why this keeps hot names under a scan: a one-off name is never hit, so it
// passes through the small queue alone and never displaces the main queue,
// which holds nine tenths of the bytes. A name asked for twice before the
// small queue turns over, or again soon after it left (the ghost), earns a
// place in the main queue.
//
// The ghost table is a fixed array of hashes, a slot chosen by the hash: a
// newer hash overwrites an older one in its slot, which ages the ghost
// without a queue, and its bytes are reserved up front.

// Frequencies an entry's hits raise, at most maxFreq.
const maxFreq = 3

// Which queue an entry is on.
const (
	inNone uint8 = iota
	inSmall
	inMain
)

// queue is a FIFO of entries, linked through the entries themselves: the
// head is the newest.
type queue struct {
	head, tail *entry
	bytes      int64
	len        int
}

// pushHead puts e at the front of q.
func (q *queue) pushHead(e *entry) {
	e.prev, e.next = nil, q.head
	if q.head != nil {
		q.head.prev = e
	} else {
		q.tail = e
	}
	q.head = e
	q.bytes += e.cost()
	q.len++
}

// remove takes e out of q.
func (q *queue) remove(e *entry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		q.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		q.tail = e.prev
	}
	e.prev, e.next = nil, nil
	q.bytes -= e.cost()
	q.len--
}

// queueOf returns the queue e is on. It requires that s.mu is held.
func (s *shard) queueOf(e *entry) *queue {
	if e.where == inMain {
		return &s.main
	}
	return &s.small
}

// insert puts e in s, replacing whatever held its hash, and evicts until s
// is within its budget again. A replaced entry of the same key hands e its
// place and frequency: a refresh is not a new name. e takes the replaced
// entry's place in the index at once, so a lookup never misses the name
// in between. It requires that s.mu is held.
func (s *shard) insert(e *entry, now int64) {
	e.where = inSmall
	e.marks.Store(s.flushes.Load() << markGen) // not yet shared: no prefetch mark to lose
	if old := s.index(e); old != nil {
		if old.sameKey(e) {
			e.where = old.where
			e.freq.Store(old.freq.Load()) // a hit on e since it was indexed may be lost
		}
		s.drop(old)
	} else if s.ghost.take(e.hash) {
		e.where = inMain
	}
	s.queueOf(e).pushHead(e)
	for s.small.bytes+s.main.bytes > s.budget {
		if s.small.bytes > s.budget/10 || s.main.len == 0 {
			s.evictSmall(now)
		} else {
			s.evictMain(now)
		}
	}
}

// evictSmall moves the small queue's oldest entries that were hit to the
// main queue, until one that was not is evicted. It requires that s.mu is
// held.
func (s *shard) evictSmall(now int64) {
	for e := s.small.tail; e != nil; e = s.small.tail {
		if e.freq.Load() > 0 && !e.dead(now, s.staleWindow) {
			s.small.remove(e)
			e.freq.Store(0)
			e.where = inMain
			s.main.pushHead(e)
			continue
		}
		s.ghost.put(e.hash)
		s.drop(e)
		s.evictions++
		return
	}
}

// evictMain evicts the main queue's oldest entry not hit since it was last
// passed over, giving each one passed over another round with a frequency
// one less. It requires that s.mu is held.
func (s *shard) evictMain(now int64) {
	for e := s.main.tail; e != nil; e = s.main.tail {
		if f := e.freq.Load(); f > 0 && !e.dead(now, s.staleWindow) {
			s.main.remove(e)
			e.freq.Store(min(f, maxFreq) - 1)
			s.main.pushHead(e)
			continue
		}
		s.drop(e)
		s.evictions++
		return
	}
}

// drop takes e out of its queue and the index. It requires that s.mu is
// held.
func (s *shard) drop(e *entry) {
	s.queueOf(e).remove(e)
	e.where = inNone
	s.unindex(e)
}

// ghost remembers the hashes of entries lately evicted from a small queue.
type ghost []uint64

// put remembers h, forgetting whatever hash held its slot.
func (g ghost) put(h uint64) {
	if len(g) > 0 {
		g[g.slot(h)] = h
	}
}

// slot returns where h is remembered: from h's high bits, as every hash
// in a shard shares the low bits that chose the shard.
func (g ghost) slot(h uint64) uint64 {
	i, _ := bits.Mul64(h, uint64(len(g)))
	return i
}

// take reports whether h is remembered, and forgets it.
func (g ghost) take(h uint64) bool {
	if len(g) == 0 || h == 0 {
		return false
	}
	slot := &g[g.slot(h)]
	if *slot != h {
		return false
	}
	*slot = 0
	return true
}
