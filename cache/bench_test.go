package cache

import (
	"runtime"
	"testing"
	"time"
	"unsafe"

	"dnsproxi/internal/wire"
)

// benchEntries is how many names the lookup benchmarks hold: a cache of
// 64 MiB holds about this many typical answers.
const benchEntries = 100000

// hotEntries is how many of them the hot benchmarks ask for: a set that
// stays in the processor's caches, as the head of a Zipf mix does.
const hotEntries = 1000

// benchCache returns a cache holding benchEntries one-record answers,
// stored at stored, and their keys.
func benchCache(b *testing.B, stored time.Time) (*Cache, []wire.Key, [][]byte) {
	b.Helper()
	c := newCache(b, Config{Size: 64 << 20})
	zn := newNames(b, 'b')
	keys := make([]wire.Key, benchEntries)
	msgs := make([][]byte, benchEntries)
	for i := range keys {
		msgs[i] = zn.reply(nil, &keys[i], i)
		if err := c.Store(&keys[i], msgs[i], stored); err != nil {
			b.Fatal(err)
		}
	}
	return c, keys, msgs
}

// BenchmarkHit is a hit: the lookup, then the records copied with their
// TTLs counted down, into a reused buffer and into a new one. Beside it,
// a plain map of the same entries, over the same keys in the same order:
// lookup ÷ map is the figure; map+entry, the map lookup and the key checked
// in the entry found, is the least any lookup that checks its key costs;
// index is the shard's index alone, what Lookup reads instead of a map. Its times are readings of the real clock, as
// the proxy passes them: they carry the monotonic reading, which Lookup
// subtracts directly (a wall-clock time like the tests' t0 costs Lookup
// time.Time.Sub's slower path, some 300 instructions more).
func BenchmarkHit(b *testing.B) {
	stored := time.Now()
	c, keys, _ := benchCache(b, stored)
	now := stored.Add(10 * time.Second)
	m := make(map[uint64]*entry, len(keys))
	for i := range keys {
		h, _ := c.Lookup(&keys[i], now)
		m[keys[i].Hash] = h.e
	}
	b.Run("hot-lookup", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, st := c.Lookup(&keys[i%hotEntries], now); st != Fresh {
				b.Fatal(st)
			}
			i += 7919
		}
	})
	b.Run("hot-map", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if m[keys[i%hotEntries].Hash] == nil {
				b.Fatal("miss")
			}
			i += 7919
		}
	})
	// The map lookup and the key checked in the entry it finds: the least
	// a lookup that answers only for its own key can do.
	b.Run("hot-map+entry", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			k := &keys[i%hotEntries]
			if e := m[k.Hash]; e == nil || !e.holds(k.Bytes()) {
				b.Fatal("miss")
			}
			i += 7919
		}
	})
	// The index alone, a shard's find over the same keys: what replaced
	// the map and the read lock around it.
	b.Run("hot-index", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			k := &keys[i%hotEntries]
			if c.shardOf(k.Hash).find(k.Hash) == nil {
				b.Fatal("miss")
			}
			i += 7919
		}
	})
	b.Run("lookup", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, st := c.Lookup(&keys[i%benchEntries], now); st != Fresh {
				b.Fatal(st)
			}
			i += 7919 // a prime: every key, in an order the caches cannot predict
		}
	})
	b.Run("map", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if m[keys[i%benchEntries].Hash] == nil {
				b.Fatal("miss")
			}
			i += 7919
		}
	})
	b.Run("map+entry", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			k := &keys[i%benchEntries]
			if e := m[k.Hash]; e == nil || !e.holds(k.Bytes()) {
				b.Fatal("miss")
			}
			i += 7919
		}
	})
	b.Run("index", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			k := &keys[i%benchEntries]
			if c.shardOf(k.Hash).find(k.Hash) == nil {
				b.Fatal("miss")
			}
			i += 7919
		}
	})
	// The same four, each lookup waiting for the one before it: the next
	// key's place is computed from what this one found (a value that is
	// always 0, which the compiler cannot know). Above, a lookup's misses
	// overlap the next ones' in the processor; in the proxy a lookup
	// follows a packet's read and never overlaps another. These are each
	// lookup's own latency.
	b.Run("chain-lookup", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			h, st := c.Lookup(&keys[i%benchEntries], now)
			if st != Fresh {
				b.Fatal(st)
			}
			i += 7919 + int(h.age>>31)
		}
	})
	b.Run("chain-map", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			e := m[keys[i%benchEntries].Hash]
			if e == nil {
				b.Fatal("miss")
			}
			i += 7919 + int(uintptr(unsafe.Pointer(e))>>63)
		}
	})
	b.Run("chain-map+entry", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			k := &keys[i%benchEntries]
			e := m[k.Hash]
			if e == nil || !e.holds(k.Bytes()) {
				b.Fatal("miss")
			}
			i += 7919 + int(e.ttl>>31)
		}
	})
	b.Run("chain-index", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			k := &keys[i%benchEntries]
			e := c.shardOf(k.Hash).find(k.Hash)
			if e == nil {
				b.Fatal("miss")
			}
			i += 7919 + int(uintptr(unsafe.Pointer(e))>>63)
		}
	})
	b.Run("lookup+copy-reused", func(b *testing.B) {
		b.ReportAllocs()
		buf := make([]byte, 0, 512)
		i := 0
		for b.Loop() {
			h, _ := c.Lookup(&keys[i%benchEntries], now)
			buf = h.AppendRecords(buf[:0])
			i += 7919
		}
	})
	b.Run("lookup+copy-new", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			h, _ := c.Lookup(&keys[i%benchEntries], now)
			_ = h.AppendRecords(make([]byte, 0, h.Len()))
			i += 7919
		}
	})
	b.Run("lookup-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				c.Lookup(&keys[i%benchEntries], now)
				i += 7919
			}
		})
	})
	b.Run("map-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				_ = m[keys[i%benchEntries].Hash]
				i += 7919
			}
		})
	})
	b.Run("hot-lookup-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				c.Lookup(&keys[i%hotEntries], now)
				i += 7919
			}
		})
	})
	b.Run("hot-map-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				_ = m[keys[i%hotEntries].Hash]
				i += 7919
			}
		})
	})
	b.Run("one-hot-name-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				c.Lookup(&keys[0], now)
			}
		})
	})
	b.Run("one-hot-name-map-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_ = m[keys[0].Hash]
			}
		})
	})
}

// BenchmarkStore is a store replacing an entry of the same key, the
// steady state of a refreshed cache, and a store of a new name that
// evicts another.
func BenchmarkStore(b *testing.B) {
	c, keys, msgs := benchCache(b, t0)
	b.Run("replace", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			j := i % benchEntries
			if err := c.Store(&keys[j], msgs[j], t0); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.Run("evict", func(b *testing.B) {
		small := newCache(b, Config{Size: MinSize})
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			j := i % benchEntries
			if err := small.Store(&keys[j], msgs[j], t0); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// BenchmarkMemory reports, for a full cache of one-record answers, the
// heap it holds and the bytes it counts, per entry.
func BenchmarkMemory(b *testing.B) {
	const size = 16 << 20
	zn := newNames(b, 'm')
	var k wire.Key
	var buf []byte
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		c := newCache(b, Config{Size: size})
		for i := range 2 * size / 200 {
			buf = zn.reply(buf, &k, i)
			if err := c.Store(&k, buf, t0); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		st := c.Stats()
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(st.Entries), "heap-B/entry")
		b.ReportMetric(float64(st.Bytes)/float64(st.Entries), "counted-B/entry")
		b.ReportMetric(float64(st.Entries), "entries")
		runtime.KeepAlive(c)
	}
}
