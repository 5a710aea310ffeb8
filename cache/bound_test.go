package cache

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// replies returns n replies of sizes from a few dozen bytes to a few
// kilobytes (TXT records), with their keys.
func replies(t testing.TB, n int, seed uint64) ([][]byte, []*wire.Key) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 3))
	out, keys := make([][]byte, n), make([]*wire.Key, n)
	for i := range n {
		q := query(fmt.Sprintf("n%d-%d.example.com.", seed, i), dns.TypeTXT, wire.KeyRD)
		var an []string
		for range 1 + r.IntN(4) {
			an = append(an, fmt.Sprintf("%s 300 IN TXT %q", q.Question[0].Name, strings.Repeat("x", 1+r.IntN(250))))
		}
		if r.IntN(20) == 0 {
			for range 12 {
				an = append(an, fmt.Sprintf("%s 300 IN TXT %q", q.Question[0].Name, strings.Repeat("y", 250)))
			}
		}
		out[i], keys[i] = pack(t, answer(t, q, dns.RcodeSuccess, an, nil, nil)), keyOf(t, q)
	}
	return out, keys
}

func TestByteBoundUnderConcurrentStores(t *testing.T) {
	for _, size := range []int64{MinSize, 3 << 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			c := newCache(t, Config{Size: size, StaleWindow: time.Minute})
			const workers, each = 4, 1500
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := range workers {
				msgs, keys := replies(t, each, uint64(w))
				wg.Go(func() {
					now := t0
					for i := range msgs {
						if err := c.Store(keys[i], msgs[i], now); err != nil {
							errs <- err
							return
						}
						c.Lookup(keys[i/2], now) // some are hit, and move to the main queue
						if b := c.Stats().Bytes; b > size {
							errs <- fmt.Errorf("%d bytes held, over the Size %d", b, size)
							return
						}
						now = now.Add(100 * time.Millisecond) // the first expire and go past their window
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			checkInvariants(t, c)
			if st := c.Stats(); st.Evictions == 0 {
				t.Fatalf("%+v: nothing evicted, the bound was never tested", st)
			}
		})
	}
}

func TestLargestMessageFits(t *testing.T) {
	q := query("big.example.com.", dns.TypeTXT, 0)
	var an []string
	for range 246 { // 246 records of 266 bytes (owner pointer, header, data)
		an = append(an, fmt.Sprintf("big.example.com. 300 IN TXT %q", strings.Repeat("z", 253)))
	}
	b := pack(t, answer(t, q, dns.RcodeSuccess, an, nil, nil))
	if len(b) > 65535 || len(b) < 64000 {
		t.Fatalf("a reply of %d bytes, want one just under 64 KiB", len(b))
	}
	c := newCache(t, Config{Size: MinSize})
	if err := c.Store(keyOf(t, q), b, t0); err != nil {
		t.Fatalf("the largest message in a cache of MinSize: %v", err)
	}
	if _, st := c.Lookup(keyOf(t, q), t0); st != Fresh {
		t.Fatalf("%v, want fresh", st)
	}
	over := append(b, make([]byte, 65536-len(b))...) // trailing bytes: no message is this long
	if err := c.Store(keyOf(t, q), over, t0); !errors.Is(err, ErrMalformed) {
		t.Fatalf("a reply of 65536 bytes: %v, want ErrMalformed", err)
	}
}

// TestEntryOverheadCoversTheStruct keeps EntryOverhead honest as the
// entry grows: its struct, rounded to the allocator's class, is 128 bytes.
func TestEntryOverheadCoversTheStruct(t *testing.T) {
	if s := unsafe.Sizeof(entry{}); s > 128 {
		t.Fatalf("an entry is %d bytes; EntryOverhead counts 128 for it", s)
	}
}

// TestEntryLayout keeps a lookup to one cache line of its entry and one
// of its shard: the entry is 128 bytes, a size class the allocator starts
// on a cache line, with everything a lookup reads in its first 64 bytes;
// what a lookup reads of a shard (its index's table and stale window)
// lies 64 bytes from every other field of it and of its neighbours, so no
// write to a shard moves that cache line but an index rebuild.
func TestEntryLayout(t *testing.T) {
	var e entry
	if s := unsafe.Sizeof(e); s != 128 {
		t.Fatalf("an entry is %d bytes, want 128: a size class of its own, aligned to a cache line", s)
	}
	for _, f := range []struct {
		name     string
		off, len uintptr
	}{
		{"expires", unsafe.Offsetof(e.expires), unsafe.Sizeof(e.expires)},
		{"ttl", unsafe.Offsetof(e.ttl), unsafe.Sizeof(e.ttl)},
		{"freq", unsafe.Offsetof(e.freq), unsafe.Sizeof(e.freq)},
		{"marks", unsafe.Offsetof(e.marks), unsafe.Sizeof(e.marks)},
		{"keyLen", unsafe.Offsetof(e.keyLen), unsafe.Sizeof(e.keyLen)},
		{"key", unsafe.Offsetof(e.key), unsafe.Sizeof(e.key)},
	} {
		if f.off+f.len > 64 {
			t.Errorf("entry.%s lies at %d..%d, past the first cache line", f.name, f.off, f.off+f.len)
		}
	}
	var s shard
	first, end := unsafe.Offsetof(s.tab), unsafe.Offsetof(s.staleWindow)+unsafe.Sizeof(s.staleWindow)
	if end-first != 16 || first < 64 || unsafe.Offsetof(s.mu) < end+64 {
		t.Errorf("a lookup reads %d..%d of a shard, the writers' fields start at %d, the shard before ends %d bytes before: want 16 bytes, 64 from either",
			first, end, unsafe.Offsetof(s.mu), first)
	}
	c := newCache(t, Config{Size: 4 << 20})
	zn := newNames(t, 'l')
	var k wire.Key
	var buf []byte
	for i := range 100 {
		buf = zn.reply(buf, &k, i)
		if err := c.Store(&k, buf, t0); err != nil {
			t.Fatal(err)
		}
		h, _ := c.Lookup(&k, t0)
		if a := uintptr(unsafe.Pointer(h.e)); a%64 != 0 {
			t.Fatalf("an entry at %#x does not start a cache line", a)
		}
	}
}

// TestHeapWithinBound measures the Go heap a full cache holds against
// what it counts: the bound must be an upper bound on real memory.
func TestHeapWithinBound(t *testing.T) {
	const size = 4 << 20
	zn := newNames(t, 'h')
	var k wire.Key
	var buf []byte
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	c := newCache(t, Config{Size: size})
	for i := range 3 * size / 200 { // several times what fits
		buf = zn.reply(buf, &k, i)
		if err := c.Store(&k, buf, t0); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	st := c.Stats()
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d entries: %d bytes counted (%.0f per entry), %d bytes of heap (%.0f per entry)",
		st.Entries, st.Bytes, float64(st.Bytes)/float64(st.Entries), heap, float64(heap)/float64(st.Entries))
	if heap > size {
		t.Fatalf("the cache holds %d bytes of heap, over its Size %d", heap, size)
	}
	runtime.KeepAlive(c)
}
