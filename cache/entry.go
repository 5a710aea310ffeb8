package cache

import (
	"encoding/binary"
	"sync/atomic"
	"time"
)

// inlineKey is how many of a key's bytes its entry holds in its first
// cache line: all of them for a name of up to 35 bytes on the wire (about
// 33 characters), which is most names asked for. A longer key keeps the
// rest at the head of data, next to the records an answer copies anyway.
const inlineKey = 40

// entry is one stored answer, laid out for a hit. Its struct is 128 bytes,
// a size class of the allocator's own, so it always starts a cache line:
// a lookup reads the first line alone (the key, the expiry, the TTL, the
// frequency), and the answer is built from the second and from data. With
// the key in data, as it once was, a lookup took three cache misses past
// the index (the entry, its data, and the entry's second line) instead of
// one. TestEntryLayout keeps it so.
//
// Everything but freq, marks, recheck, where and the queue links is
// set before the entry is shared and never changed.
type entry struct {
	// The first cache line: what a lookup reads.
	expires int64         // when its TTL runs out, as mono returns it
	ttl     uint32        // seconds from its store to expires
	freq    atomic.Uint32 // hits, up to maxFreq: written only when it changes
	marks   atomic.Uint32 // markPrefetched, set once, never cleared; above it, the flushes before its store (flushedSince)
	keyLen  uint16
	where   uint8           // the queue it is on; guarded by the shard's lock
	neg     bool            // NXDOMAIN or NODATA, as readReply decided
	key     [inlineKey]byte // the key's first bytes (Key.Bytes); zeros after keyLen

	// The second: what an answer is built from, and the shard's bookkeeping.
	data              []byte // the key's bytes past inlineKey, the records, each TTL field's offset (2 bytes)
	hash              uint64
	recheck           atomic.Int64 // until when a failed refresh is not retried; 0 none
	prev, next        *entry       // guarded by the shard's lock
	flags, an, ns, ar uint16
}

// An entry's marks: markPrefetched, and above it, from its store on, its
// shard's count of flushes then (markGen and up).
const (
	markPrefetched = 1 // a lookup in its last tenth of TTL was told to refresh it (Hit.Prefetch)
	markGen        = 1 // the shift of the count of flushes
)

// flushedSince reports whether s was flushed since e was stored in it: if
// so, e is never served again, stale or not, whether the flush found it or
// it had been evicted or replaced before (a Hit carried by a refresh in
// flight outlives both). The count wraps after 2^31 flushes.
func (e *entry) flushedSince(s *shard) bool {
	return e.marks.Load()>>markGen != s.flushes.Load()<<markGen>>markGen
}

// newEntry returns the entry of key holding data (key's bytes past
// inlineKey, then the records and their TTL offsets), stored at now.
func newEntry(hash uint64, key, data []byte, r *reply, now int64) *entry {
	e := &entry{
		expires: now + int64(r.ttl)*int64(time.Second), ttl: r.ttl, keyLen: uint16(len(key)),
		data: data, hash: hash, flags: r.flags, an: uint16(r.an), ns: uint16(r.ns), ar: uint16(r.ar),
		neg: r.negative,
	}
	copy(e.key[:], key)
	return e
}

// keyTail returns how many of the key's bytes data holds before the records.
func (e *entry) keyTail() int { return max(int(e.keyLen)-inlineKey, 0) }

// holds reports whether e is stored under key (Key.Bytes). A key that fits
// inline is compared without leaving the entry's first cache line.
func (e *entry) holds(key []byte) bool {
	if len(key) != int(e.keyLen) {
		return false
	}
	if len(key) <= inlineKey && len(key) >= 8 {
		return e.holdsInline(key)
	}
	return e.holdsSlow(key)
}

// holdsSlow is holds for a key longer than inlineKey or shorter than 8
// bytes.
func (e *entry) holdsSlow(key []byte) bool {
	n := len(key)
	if n <= inlineKey {
		return string(e.key[:n]) == string(key)
	}
	return string(e.key[:]) == string(key[:inlineKey]) && string(e.data[:n-inlineKey]) == string(key[inlineKey:])
}

// holdsInline reports whether e.key holds key, of 8 to inlineKey bytes:
// word by word, the last word the key's last 8 bytes (overlapping the one
// before), in a few instructions and no call. Most keys are so (a name of
// 3 to 35 bytes on the wire); the memory compare's call was a fifth of a
// hot hit and a seventh of a lookup waiting on memory.
func (e *entry) holdsInline(key []byte) bool {
	n := len(key)
	last := n - 8
	diff := binary.LittleEndian.Uint64(e.key[last:]) ^ binary.LittleEndian.Uint64(key[last:])
	for i := 0; i < last; i += 8 {
		diff |= binary.LittleEndian.Uint64(e.key[i:]) ^ binary.LittleEndian.Uint64(key[i:])
	}
	return diff == 0
}

// sameKey reports whether e and o are stored under the same key.
func (e *entry) sameKey(o *entry) bool {
	return e.keyLen == o.keyLen && e.key == o.key && string(e.data[:e.keyTail()]) == string(o.data[:o.keyTail()])
}

// records returns the stored records, TTLs at age 0. Never write to them.
func (e *entry) records() []byte {
	tail := e.keyTail()
	return e.data[tail : len(e.data)-2*e.count()]
}

// offsets returns where each record's TTL field lies among the records,
// two bytes each.
func (e *entry) offsets() []byte { return e.data[len(e.data)-2*e.count():] }

// count returns how many records e holds.
func (e *entry) count() int { return int(e.an) + int(e.ns) + int(e.ar) }

// negative reports whether e is NXDOMAIN or NODATA, as readReply decides.
func (e *entry) negative() bool { return e.neg }

// cost returns the bytes e counts against its shard's budget.
func (e *entry) cost() int64 { return int64(cap(e.data)) + EntryOverhead }

// stored returns when e was stored, as mono returns it.
func (e *entry) stored() int64 { return e.expires - int64(e.ttl)*int64(time.Second) }

// dead reports whether e is past its stale window at now. (Not as a sum:
// expires + staleWindow overflows for a window near 2^63 ns; and the
// difference is taken only once now has reached expires, so a reading far
// before the epoch cannot wrap it.)
func (e *entry) dead(now, staleWindow int64) bool {
	return now >= e.expires && now-e.expires >= staleWindow
}

// touch counts a hit on e, up to maxFreq. It writes only when the count
// changes, so the hottest entries, at the cap, keep their cache line
// shared between cores; two hits racing may count once, which the policy
// does not mind.
func (e *entry) touch() {
	if f := e.freq.Load(); f < maxFreq {
		e.freq.Store(f + 1)
	}
}
