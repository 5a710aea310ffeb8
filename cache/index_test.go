package cache

import (
	"bytes"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"dnsproxi/internal/wire"
)

// recordsOf returns the records of reply as the cache stores them: what
// follows its question (the replies here have no OPT, and every TTL
// within the default bounds).
func recordsOf(t testing.TB, reply []byte) []byte {
	t.Helper()
	qend, ok := wire.QuestionEnd(reply)
	if !ok {
		t.Fatal("no question")
	}
	sec, ok := wire.ReadSections(reply, qend)
	if !ok {
		t.Fatal("the reply does not walk")
	}
	if sec.OPTStart != 0 {
		t.Fatal("the reply has an OPT")
	}
	return reply[qend:sec.End]
}

// TestConcurrentHitsHoldTheirOwnKey has goroutines store into a cache
// that holds a fraction of the names (every store evicts), mark failures,
// flush, and look up, on the real clock for -race: every hit for key k
// must give k's own records, whatever the index was doing meanwhile.
func TestConcurrentHitsHoldTheirOwnKey(t *testing.T) {
	tests := []struct {
		name       string
		flushEvery int // a writer's stores between flushes; 0 never
	}{
		{"evicting", 0},
		{"flushing", 300},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCache(t, Config{Size: MinSize, StaleWindow: time.Hour})
			msgs, keys := replies(t, 3000, 21) // some 4 MiB of answers: 16 times the cache
			want := make([][]byte, len(msgs))
			for j := range msgs {
				want[j] = recordsOf(t, msgs[j])
			}
			if err := c.Store(keys[0], msgs[0], time.Now()); err != nil {
				t.Fatal(err)
			}
			if h, st := c.Lookup(keys[0], time.Now()); st != Fresh || !bytes.Equal(h.Records(), want[0]) {
				t.Fatalf("%v: a stored answer's records are not the reply's", st)
			}
			deadline := time.Now().Add(2 * time.Second)
			var hits, lookups atomic.Int64
			var wg sync.WaitGroup
			for w := range 6 {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(w), 7))
					for i := 0; i < 30000 && time.Now().Before(deadline); i++ {
						j := r.IntN(len(keys))
						now := time.Now()
						switch {
						case w < 2: // the writers
							if err := c.Store(keys[j], msgs[j], now); err != nil {
								t.Error(err)
								return
							}
							if tt.flushEvery > 0 && w == 0 && i%tt.flushEvery == 0 {
								c.Flush()
							}
						case i%100 == 0:
							c.RefreshFailed(keys[j], now)
						default:
							j %= len(keys) / 4 // a quarter of the names, so many lookups hit
							lookups.Add(1)
							h, st := c.Lookup(keys[j], now)
							if st == Miss {
								continue
							}
							hits.Add(1)
							if !bytes.Equal(h.Records(), want[j]) {
								t.Errorf("a %v hit for name %d gives other records", st, j)
								return
							}
						}
					}
				})
			}
			wg.Wait()
			t.Logf("%d hits of %d lookups", hits.Load(), lookups.Load())
			if hits.Load() == 0 {
				t.Fatal("no lookup hit: nothing was checked")
			}
			checkInvariants(t, c)
			if st := c.Stats(); st.Evictions == 0 {
				t.Fatalf("%+v: nothing evicted, the index's removals were never tested", st)
			}
			c.Flush()
			for j := range keys {
				if _, st := c.Lookup(keys[j], time.Now()); st != Miss {
					t.Fatalf("name %d after Flush: %v", j, st)
				}
			}
			checkInvariants(t, c)
		})
	}
}

// indexShard returns a shard with an empty index, for the index's own
// tests: entries there need nothing but their hash.
func indexShard() *shard {
	s := new(shard)
	s.resetIndex()
	return s
}

// checkIndex checks s's index against model, what it should hold: each
// hash finds its entry, the gone hashes find nothing, and the counts and
// the table's load are what the bound counts on.
func checkIndex(t *testing.T, s *shard, model map[uint64]*entry, gone []uint64) {
	t.Helper()
	for h, e := range model {
		if got := s.find(h); got != e {
			t.Fatalf("hash %#x finds %p, want %p", h, got, e)
		}
	}
	for _, h := range gone {
		if _, ok := model[h]; !ok && s.find(h) != nil {
			t.Fatalf("hash %#x, removed, is still found", h)
		}
	}
	live, used := indexCounts(s.tab.Load())
	size := len(s.tab.Load().slots)
	if live != len(model) || live != s.live || used != s.used {
		t.Fatalf("the index holds %d entries and %d with tombstones, says %d and %d; want %d", live, used, s.live, s.used, len(model))
	}
	if 2*size > max(2*minSlots, 5*live) || 4*used > 3*size {
		t.Fatalf("a table of %d slots for %d entries, %d with tombstones: past the loads the bound counts on", size, live, used)
	}
}

// TestIndexKeepsLiveEntries grows an index, fills it with tombstones,
// replaces entries in place and shrinks it, checking after every step
// that every entry it holds is found and none it removed: hashes spread,
// hashes that all start at one slot (one long probe), and hash 0 among
// them.
func TestIndexKeepsLiveEntries(t *testing.T) {
	tests := []struct {
		name string
		hash func(i int) uint64
	}{
		{"spread", func(i int) uint64 { return rand.New(rand.NewPCG(uint64(i), 5)).Uint64() }},
		{"one-start", func(i int) uint64 { return uint64(i) }},                       // top bits 0: every probe starts at slot 0
		{"one-start-near-end", func(i int) uint64 { return ^uint64(0) - uint64(i) }}, // at the last slot: probes wrap
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := indexShard()
			model := map[uint64]*entry{}
			var gone []uint64
			r := rand.New(rand.NewPCG(1, 1))
			sizes := map[int]bool{}
			step := func(what string, i int) {
				t.Helper()
				sizes[len(s.tab.Load().slots)] = true
				if t.Failed() {
					t.Fatalf("after %s %d", what, i)
				}
				checkIndex(t, s, model, gone)
			}
			put := func(i int) {
				e := &entry{hash: tt.hash(i)}
				old := s.index(e)
				if old != model[e.hash] {
					t.Fatalf("index(%d) replaced %p, want %p", i, old, model[e.hash])
				}
				model[e.hash] = e
				step("put", i)
			}
			remove := func(i int) {
				h := tt.hash(i)
				if e := model[h]; e != nil {
					s.unindex(e)
					s.unindex(e) // twice: the second finds nothing, and changes nothing
					delete(model, h)
					gone = append(gone[max(len(gone)-50, 0):], h) // the latest
					step("remove", i)
				}
			}
			const n = 200      // the table grows to 400 slots
			for i := range n { // grows through several sizes
				put(i)
			}
			for i := range n / 2 { // the same hashes again: replaced in place
				put(i)
			}
			for round := range 4 { // churn: tombstones, reused by their own hash or rebuilt away
				for range n / 4 {
					remove(r.IntN(n))
				}
				for range n / 4 {
					put(r.IntN(n + 10*round))
				}
			}
			for i := range n + 1000 { // shrinks back to the smallest table
				remove(i)
			}
			if len(s.tab.Load().slots) != minSlots || s.live != 0 {
				t.Fatalf("emptied: a table of %d slots, %d live", len(s.tab.Load().slots), s.live)
			}
			if len(sizes) < 4 {
				t.Fatalf("the table took only the sizes %v: growth and shrinking were not tested", sizes)
			}
		})
	}
}

// TestIndexReadersDuringRebuilds has readers look up, with no lock, a set
// of entries that stay in the index while a writer puts and removes
// others, growing, clearing and shrinking the table hundreds of times: a
// reader on any table, old or new, must find every one of them, every
// time, and whatever they find for a hash of the churn must be of that
// hash.
func TestIndexReadersDuringRebuilds(t *testing.T) {
	s := indexShard()
	stay := make([]*entry, 200)
	for i := range stay {
		stay[i] = &entry{hash: uint64(i) << 56} // spread over the table, among the churn's
		s.mu.Lock()
		s.index(stay[i])
		s.mu.Unlock()
	}
	// 200 rebuilds, or 2 s; on a loaded machine, where the readers leave
	// the writer little time, at least the 20 checked below, for up to 30 s.
	start := time.Now()
	enough := func(rebuilds int64) bool {
		since := time.Since(start)
		return rebuilds >= 200 || since > 2*time.Second && rebuilds >= 20 || since > 30*time.Second
	}
	stop := make(chan struct{})
	var rebuilds atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() { // the writer
		defer close(stop)
		var churn []*entry
		at := map[uint64]int{} // where each churn hash lies in churn
		r := rand.New(rand.NewPCG(3, 3))
		last := s.tab.Load()
		for i := 0; !enough(rebuilds.Load()); i++ {
			s.mu.Lock()
			// Grow to some 3000 entries and back to none, over and over.
			if len(churn) == 0 || (i/4000)%2 == 0 && len(churn) < 3000 && r.IntN(4) > 0 {
				e := &entry{hash: churnHash(r)}
				if s.index(e) != nil {
					churn[at[e.hash]] = e
				} else {
					at[e.hash] = len(churn)
					churn = append(churn, e)
				}
			} else {
				k := r.IntN(len(churn))
				s.unindex(churn[k])
				delete(at, churn[k].hash)
				churn[k] = churn[len(churn)-1]
				at[churn[k].hash] = k
				churn = churn[:len(churn)-1]
				if k < len(churn) {
					at[churn[k].hash] = k
				}
			}
			if t := s.tab.Load(); t != last {
				last = t
				rebuilds.Add(1)
			}
			s.mu.Unlock()
		}
	})
	var finds atomic.Int64
	for w := range 3 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 9))
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				e := stay[i%len(stay)]
				if got := s.find(e.hash); got != e {
					t.Errorf("hash %#x, never removed, finds %p, want %p", e.hash, got, e)
					return
				}
				h := churnHash(r)
				if got := s.find(h); got != nil && got.hash != h {
					t.Errorf("hash %#x finds an entry of hash %#x", h, got.hash)
					return
				}
				finds.Add(1)
			}
		})
	}
	wg.Wait()
	t.Logf("%d rebuilds under %d lookups", rebuilds.Load(), finds.Load())
	if rebuilds.Load() < 20 {
		t.Fatalf("only %d rebuilds: the readers were not tested against them", rebuilds.Load())
	}
}

// TestIndexHashesInAShard checks that an index spreads the entries of a
// many-shard cache over its table, though their low bits, which chose
// their shard, are all the same: the mean probe of a shard's entries, from
// the slot its hash starts at to the entry's, stays near what linear
// probing gives at its load (2.5 slots at 3/4, the most a table holds),
// far from the hundreds it would be if the low bits chose where a probe
// starts.
func TestIndexHashesInAShard(t *testing.T) {
	c := newCache(t, Config{Size: 64 << 20})
	zn := newNames(t, 's')
	var k wire.Key
	var buf []byte
	for i := range 20000 {
		buf = zn.reply(buf, &k, i)
		if err := c.Store(&k, buf, t0); err != nil {
			t.Fatal(err)
		}
	}
	all, entries, worst := 0, 0, 0.0
	for i := range c.shards {
		tab := c.shards[i].tab.Load()
		probes, n := 0, 0
		for j := range tab.slots {
			if e := tab.slots[j].e.Load(); e != nil && e != tombstone {
				probes += 1 + (j-tab.start(e.hash)+len(tab.slots))%len(tab.slots)
				n++
			}
		}
		if n > 0 && probes > 6*n {
			t.Fatalf("shard %d: a mean probe of %.1f slots for %d entries in a table of %d: the hashes are not spread", i, float64(probes)/float64(n), n, len(tab.slots))
		}
		all += probes
		entries += n
		worst = max(worst, float64(probes)/float64(max(n, 1)))
	}
	mean := float64(all) / float64(entries)
	t.Logf("a mean probe of %.2f slots over %d entries, %.2f in the worst shard", mean, entries, worst)
	if mean > 2.5 {
		t.Fatalf("a mean probe of %.2f slots over %d entries, more than linear probing takes at a load of 3/4: the hashes are not spread", mean, entries)
	}
}

// churnHash returns one of 8192 hashes, none of them a staying entry's of
// TestIndexReadersDuringRebuilds (their low bits are 0).
func churnHash(r *rand.Rand) uint64 { return uint64(r.IntN(8192))<<51 | 1 }
