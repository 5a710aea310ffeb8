// Package cache is dnsproxi's answer cache: upstream replies stored by
// their query key (wire.Key), answered back with every TTL counted down,
// and kept past expiry for serve-stale (RFC 8767) when a refresh fails.
//
// It is pure like guard: no networking, no metrics, no logging, and no
// clock of its own — every call that depends on time takes now. What is
// stored and for how long is in reply.go, the eviction policy (S3-FIFO,
// weighed in bytes) in s3fifo.go, and what a hit gives the proxy to build
// an answer from in hit.go.
//
// The bytes held never exceed Config.Size: each entry counts the bytes it
// stores (its key, its records, two bytes per record for where its TTL
// lies, rounded up to the allocator's size class) plus EntryOverhead for
// its bookkeeping and its slot in the map, and the ghost table of each
// shard is reserved up front. A lookup takes a shard's read lock only and
// allocates nothing.
package cache

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"dnsproxi/internal/wire"
)

// EntryOverhead is what an entry counts besides its stored bytes: its
// struct (128 bytes with the allocator's rounding) and its map slot (a
// key, a pointer and a control byte, 17 bytes, over a load that may fall to
// half after the map grows).
const EntryOverhead = 128 + 40

// GhostSlotBytes is what a ghost slot counts: one hash.
const GhostSlotBytes = 8

// bytesPerGhostSlot is how many bytes of a shard buy one ghost slot: about
// one per entry of a typical size, as S3-FIFO's ghost holds as many hashes
// as the main queue holds entries.
const bytesPerGhostSlot = 256

// Sharding: one shard per shardBytes of the size, at most maxShards.
const (
	shardBytes = 1 << 20
	maxShards  = 64
)

// State is what Lookup found.
type State int

// What Lookup found for a key.
const (
	// Miss: nothing to answer with.
	Miss State = iota
	// Fresh: answer from the Hit, TTLs counted down.
	Fresh
	// Expired: past its TTL but within the stale window. Refresh it first;
	// answer from the Hit (stale) only if the refresh fails, and then call
	// RefreshFailed.
	Expired
	// Stale: past its TTL, and a refresh failed less than RecheckAfter ago:
	// answer from the Hit (stale) at once, without asking upstream.
	Stale
)

// String returns "miss", "fresh", "expired" or "stale".
func (s State) String() string {
	switch s {
	case Fresh:
		return "fresh"
	case Expired:
		return "expired"
	case Stale:
		return "stale"
	}
	return "miss"
}

// Cache holds answers by query key within a byte bound. It is safe for
// concurrent use. Build it with New.
type Cache struct {
	cfg    Config
	shards []shard
	mask   uint64
}

// shard is one lock's share of the cache.
type shard struct {
	mu          sync.RWMutex
	m           map[uint64]*entry
	small, main queue
	ghost       ghost
	budget      int64 // bytes the entries may count
	evictions   uint64
	staleWindow int64
	_           [64]byte // keeps neighbouring shards' locks off one cache line
}

// entry is one stored answer. Everything but freq, recheck, prefetched and
// the queue fields is set before it is shared and never changed.
type entry struct {
	hash       uint64
	data       []byte // the key's bytes, the records, each TTL field's offset (2 bytes)
	keyLen     uint16
	recLen     uint16
	flags      uint16
	an, ns, ar uint16
	negative   bool
	where      uint8 // the queue it is on; guarded by the shard's lock
	ttl        uint32
	stored     int64 // when, as mono returns it
	expires    int64
	cost       int64
	recheck    atomic.Int64 // until when a failed refresh is not retried; 0 none
	freq       atomic.Uint32
	prefetched atomic.Bool
	prev, next *entry // guarded by the shard's lock
}

// New returns an empty cache, or an error wrapping ErrConfig for a field
// out of its range.
func New(cfg Config) (*Cache, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	n := 1
	for n < maxShards && int64(n)*2*shardBytes <= cfg.Size {
		n *= 2
	}
	c := &Cache{cfg: cfg, shards: make([]shard, n), mask: uint64(n - 1)}
	per := cfg.Size / int64(n)
	slots := per / bytesPerGhostSlot
	for i := range c.shards {
		s := &c.shards[i]
		s.m = make(map[uint64]*entry)
		s.ghost = make(ghost, slots)
		s.budget = per - slots*GhostSlotBytes
		s.staleWindow = int64(cfg.StaleWindow)
	}
	return c, nil
}

// epoch is what mono counts from: a reading with the monotonic clock, so
// real readings are compared on it and a wall-clock step moves no TTL.
var epoch = time.Now()

// mono returns now as nanoseconds since epoch.
func mono(now time.Time) int64 { return int64(now.Sub(epoch)) }

func (c *Cache) shardOf(h uint64) *shard { return &c.shards[h&c.mask] }

// sameKey reports whether e and o are stored under the same key.
func (e *entry) sameKey(o *entry) bool { return string(e.key()) == string(o.key()) }

func (e *entry) key() []byte { return e.data[:e.keyLen] }

// dead reports whether e is past its stale window at now.
func (e *entry) dead(now, staleWindow int64) bool { return now >= e.expires+staleWindow }

// touch counts a hit on e, up to maxFreq; at the cap it writes nothing,
// so the hottest entries do not bounce their cache line between cores.
func (e *entry) touch() {
	if f := e.freq.Load(); f < maxFreq {
		e.freq.CompareAndSwap(f, f+1)
	}
}

// Lookup returns what the cache holds for k at now, and what to do with it
// (State). It allocates nothing.
func (c *Cache) Lookup(k *wire.Key, now time.Time) (Hit, State) {
	s := c.shardOf(k.Hash)
	s.mu.RLock()
	e := s.m[k.Hash]
	if e == nil || string(e.key()) != string(k.Bytes()) {
		s.mu.RUnlock()
		return Hit{}, Miss
	}
	t := mono(now)
	if e.dead(t, s.staleWindow) {
		s.mu.RUnlock()
		return Hit{}, Miss
	}
	e.touch()
	s.mu.RUnlock()
	h := Hit{e: e, age: uint32(max(t-e.stored, 0) / int64(time.Second))}
	if t < e.expires {
		h.prefetch = c.cfg.Prefetch && t >= e.expires-int64(e.ttl)*int64(time.Second)/10 && e.prefetched.CompareAndSwap(false, true)
		return h, Fresh
	}
	h.stale = true
	if r := e.recheck.Load(); r != 0 && t < r {
		return h, Stale
	}
	return h, Expired
}

// Store reads reply, the upstream's answer to k's query, and stores it if
// it is cacheable (reply.go), replacing what k held. It returns nil, or why
// reply was not stored (ErrTruncated, ErrRcode...). reply is copied.
func (c *Cache) Store(k *wire.Key, reply []byte, now time.Time) error {
	key := k.Bytes()
	r, err := readReply(reply, key, &c.cfg)
	if err != nil {
		return err
	}
	n := r.an + r.ns + r.ar
	data := slices.Grow([]byte(nil), len(key)+r.end-r.start+2*n) // rounded up to its size class
	data = append(data, key...)
	data = r.appendRecords(data, reply, &c.cfg)
	t := mono(now)
	e := &entry{
		hash: k.Hash, data: data, keyLen: uint16(len(key)), recLen: uint16(r.end - r.start),
		flags: r.flags, an: uint16(r.an), ns: uint16(r.ns), ar: uint16(r.ar), negative: r.negative,
		ttl: r.ttl, stored: t, expires: t + int64(r.ttl)*int64(time.Second),
		cost: int64(cap(data)) + EntryOverhead,
	}
	s := c.shardOf(k.Hash) // MinSize gives every shard room for the largest message
	s.mu.Lock()
	s.insert(e, t)
	s.mu.Unlock()
	return nil
}

// RefreshFailed tells the cache that refreshing k's entry failed at now:
// until RecheckAfter has passed, Lookup answers Stale instead of Expired,
// so a dead upstream is not asked name by name.
func (c *Cache) RefreshFailed(k *wire.Key, now time.Time) {
	s := c.shardOf(k.Hash)
	s.mu.RLock()
	e := s.m[k.Hash]
	if e != nil && string(e.key()) == string(k.Bytes()) {
		e.recheck.Store(mono(now) + int64(RecheckAfter))
	}
	s.mu.RUnlock()
}

// Flush empties the cache.
func (c *Cache) Flush() {
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		s.m = make(map[uint64]*entry)
		s.small, s.main = queue{}, queue{}
		clear(s.ghost)
		s.mu.Unlock()
	}
}

// Stats is what a cache holds, for its metrics.
type Stats struct {
	Entries   int
	Bytes     int64  // what the bound counts: entries, their overhead, the ghost tables
	Evictions uint64 // entries evicted to make room, since New
}

// Stats returns the cache's counts, each shard read under its lock.
func (c *Cache) Stats() Stats {
	var st Stats
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		st.Entries += s.small.len + s.main.len
		st.Bytes += s.small.bytes + s.main.bytes + int64(len(s.ghost))*GhostSlotBytes
		st.Evictions += s.evictions
		s.mu.RUnlock()
	}
	return st
}
