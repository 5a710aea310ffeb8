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
// stores (its key past what its struct holds, its records, two bytes per
// record for where its TTL lies, rounded up to the allocator's size class)
// plus EntryOverhead for its struct and its share of the index, and the
// ghost table and smallest index of each shard are reserved up front. A
// lookup takes no lock and writes nothing shared but an entry's frequency
// (when it changes) and, once, its prefetch mark: it reads its shard's
// index (index.go), one cache line of the entry it finds (entry.go), and
// allocates nothing.
package cache

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"dnsproxi/internal/wire"
)

// EntryOverhead is what an entry counts besides its stored bytes: its
// struct (128 bytes, a size class of its own) and its share of its
// shard's index: a slot of 16 bytes (a hash and a pointer) at a load
// never under 2/5 once the index is past its reserved smallest size
// (index.go), so 5/2 slots, 40 bytes.
const EntryOverhead = 128 + 5*slotBytes/2

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

// shard is one lock's share of the cache. What a lookup reads of it, its
// index's table and its stale window, lies 64 bytes from any other field
// of it or of its neighbours, however the allocator places the shards
// (TestEntryLayout): no store, eviction or lock taken on any shard moves
// the cache line a lookup reads from the cores that read it, and only an
// index rebuild writes it.
type shard struct {
	_           [64]byte
	tab         atomic.Pointer[table] // the index (index.go)
	staleWindow int64
	_           [64]byte

	// The writers', under mu.
	mu          sync.Mutex
	small, main queue
	ghost       ghost
	budget      int64         // bytes the entries may count
	flushes     atomic.Uint32 // Flush calls, written under mu, read by Servable without it (entry.flushedSince)
	evictions   uint64
	live, used  int // the index's slots holding an entry, and an entry or a tombstone
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
		s.resetIndex()
		s.ghost = make(ghost, slots)
		s.budget = per - s.reserved()
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

// reserved returns the bytes s sets aside up front: its ghost table and
// its index's smallest table.
func (s *shard) reserved() int64 {
	return int64(len(s.ghost))*GhostSlotBytes + minSlots*slotBytes
}

// Lookup returns what the cache holds for k at now, and what to do with it
// (State). It allocates nothing.
func (c *Cache) Lookup(k *wire.Key, now time.Time) (Hit, State) {
	t := mono(now)
	s := c.shardOf(k.Hash)
	e := s.find(k.Hash) // its fields a lookup reads are set before it is shared, or atomic
	if e == nil || !e.holds(k.Bytes()) || e.dead(t, s.staleWindow) {
		return Hit{}, Miss
	}
	e.touch()
	h := Hit{e: e, age: uint32(max(t-e.stored(), 0) / int64(time.Second))}
	if t < e.expires {
		// Loaded before the swap: a swap that fails still takes the cache
		// line from the other cores, and every hit in the last tenth would.
		h.prefetch = c.cfg.Prefetch && t >= e.expires-int64(e.ttl)*int64(time.Second)/10 &&
			e.marks.Load()&markPrefetched == 0 && e.marks.Or(markPrefetched)&markPrefetched == 0
		return h, Fresh
	}
	h.stale = true
	if r := e.recheck.Load(); r != 0 && t < r {
		return h, Stale
	}
	return h, Expired
}

// Servable reports whether h's entry may still be answered at now: it is
// not past Config.StaleWindow after its expiry, and not flushed. The window is the maximum stale timer (RFC 8767
// §5), so a caller that serves a stale Hit later than its Lookup — when a
// refresh fails or is refused, or a client-response timer fires — asks
// again then; and a flush empties the cache of the answers refreshes in
// flight carry, not only of those it holds
// (TestFlushEndsTheStaleAnswersRefreshesCarry). The zero Hit is not.
func (c *Cache) Servable(h Hit, now time.Time) bool {
	return h.e != nil && !h.e.flushedSince(c.shardOf(h.e.hash)) && !h.e.dead(mono(now), int64(c.cfg.StaleWindow))
}

// Store reads reply, the upstream's answer to k's query, and stores it if
// it is cacheable (reply.go), replacing what k held. It returns nil, or why
// reply was not stored (ErrTruncated, ErrRcode...). reply is copied.
//
// An answer that cannot be kept but is the upstream's word on the name — a
// TTL of 0, a negative answer without an SOA — still supersedes what k
// held, which is dropped: kept, it would come back as a stale answer once
// the upstream fails, data the upstream has since changed or withdrawn.
// One that says nothing about the name (REFUSED, TC, unreadable) leaves
// it, and so does a CNAME chain that stops short of the type asked with no
// SOA: a resolver that could not follow the chain to its end may answer
// so, and that is when the stale answer is wanted.
func (c *Cache) Store(k *wire.Key, reply []byte, now time.Time) error {
	key := k.Bytes()
	r, err := readReply(reply, key, &c.cfg)
	if errors.Is(err, ErrZeroTTL) || errors.Is(err, ErrNoSOA) && r.an == 0 {
		c.forget(k)
	}
	if err != nil {
		return err
	}
	tail := key[min(len(key), inlineKey):]
	n := r.an + r.ns + r.ar
	data := slices.Grow([]byte(nil), len(tail)+r.end-r.start+2*n) // rounded up to its size class
	data = append(data, tail...)
	data = r.appendRecords(data, reply, &c.cfg)
	t := mono(now)
	e := newEntry(k.Hash, key, data, &r, t)
	s := c.shardOf(k.Hash) // MinSize gives every shard room for the largest message
	s.mu.Lock()
	s.insert(e, t)
	s.mu.Unlock()
	return nil
}

// forget drops the entry k holds, if any.
func (c *Cache) forget(k *wire.Key) {
	s := c.shardOf(k.Hash)
	s.mu.Lock()
	if e := s.find(k.Hash); e != nil && e.holds(k.Bytes()) && e.where != inNone {
		s.drop(e)
	}
	s.mu.Unlock()
}

// RefreshFailed tells the cache that refreshing k's entry failed at now:
// until RecheckAfter has passed, Lookup answers Stale instead of Expired,
// so a dead upstream is not asked name by name. It marks the entry held
// under k now; a caller that holds the Hit it was refreshing should use
// Hit.RefreshFailed, which marks that entry only.
func (c *Cache) RefreshFailed(k *wire.Key, now time.Time) {
	s := c.shardOf(k.Hash)
	if e := s.find(k.Hash); e != nil && e.holds(k.Bytes()) { // evicted meanwhile, it is marked for nothing
		e.recheck.Store(mono(now) + int64(RecheckAfter))
	}
}

// Flush empties the cache. A Hit found before it is no longer Servable,
// so a refresh in flight cannot serve it stale: each shard counts its
// flushes, and an entry holds the count it was stored under — an entry
// evicted before the flush is as flushed as one it drops. (The count is
// read only when a stale answer is about to be served, so a lookup pays
// nothing for it; a count that every Lookup read cost a hot hit 3 ns.)
func (c *Cache) Flush() {
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		s.flushes.Add(1)
		s.resetIndex() // a lookup already on the old table may still find an entry there
		s.small, s.main = queue{}, queue{}
		clear(s.ghost)
		s.mu.Unlock()
	}
}

// Stats is what a cache holds, for its metrics.
type Stats struct {
	Entries   int
	Bytes     int64  // what the bound counts: entries, their overhead, what each shard reserves
	Evictions uint64 // entries evicted to make room, since New
}

// Stats returns the cache's counts, each shard read under its lock.
func (c *Cache) Stats() Stats {
	var st Stats
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		st.Entries += s.small.len + s.main.len
		st.Bytes += s.small.bytes + s.main.bytes + s.reserved()
		st.Evictions += s.evictions
		s.mu.Unlock()
	}
	return st
}
