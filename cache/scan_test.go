package cache

import (
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// names makes replies for names of one width, "<p>NNNNNN.example.com.",
// by writing the number into one packed reply: cheap enough to make a
// reply per query.
type names struct {
	tmpl  []byte
	qend  int
	digit int // where the number's first digit lies
}

func newNames(t testing.TB, prefix byte) *names {
	t.Helper()
	q := query(string(prefix)+"000000.example.com.", dns.TypeA, wire.KeyRD)
	b := pack(t, answer(t, q, dns.RcodeSuccess, []string{q.Question[0].Name + " 3600 IN A 192.0.2.1"}, nil, nil))
	qend, _ := wire.QuestionEnd(b)
	return &names{tmpl: b, qend: qend, digit: wire.HeaderLen + 2}
}

// reply writes the reply for number i into buf, and its key into k.
func (n *names) reply(buf []byte, k *wire.Key, i int) []byte {
	buf = append(buf[:0], n.tmpl...)
	for d := n.digit + 5; d >= n.digit; d-- {
		buf[d] = byte('0' + i%10)
		i /= 10
	}
	k.Set(buf[wire.HeaderLen:n.qend], wire.KeyRD)
	return buf
}

// zipf draws ranks 0..n-1 with probability proportional to 1/(rank+1):
// s = 1, which math/rand's Zipf does not take.
type zipf struct {
	cdf []float64
	r   *rand.Rand
}

func newZipf(n int, seed uint64) *zipf {
	z := &zipf{cdf: make([]float64, n), r: rand.New(rand.NewPCG(seed, 1))}
	sum := 0.0
	for i := range n {
		sum += 1 / float64(i+1)
		z.cdf[i] = sum
	}
	for i := range z.cdf {
		z.cdf[i] /= sum
	}
	return z
}

func (z *zipf) next() int { return sort.SearchFloat64s(z.cdf, z.r.Float64()) }

// scanRun asks zipfQueries names drawn from a Zipf working set of setSize,
// with flood one-off names mixed in at the share flood of all queries, of
// a cache sized at a tenth of the working set's bytes. It stores on every
// miss and returns the hit rate on the Zipf queries after the first
// quarter (the warm-up).
func scanRun(t testing.TB, setSize, zipfQueries int, flood float64) float64 {
	t.Helper()
	zn, fn := newNames(t, 'z'), newNames(t, 'f')
	var k wire.Key
	var buf []byte
	// One entry's cost, from one stored: every name has the same width.
	probe := newCache(t, Config{Size: MinSize})
	if err := probe.Store(&k, zn.reply(buf, &k, 0), t0); err != nil {
		t.Fatal(err)
	}
	st := probe.Stats()
	perEntry := st.Bytes - probe.shards[0].reserved()
	c := newCache(t, Config{Size: max(MinSize, perEntry*int64(setSize)/10)})
	z := newZipf(setSize, 1)
	mix := rand.New(rand.NewPCG(2, 2))
	now := t0
	oneOff := 0
	hits, counted := 0, 0
	for i := range zipfQueries {
		for mix.Float64() < flood { // a geometric run of one-off names: flood of all queries
			buf = fn.reply(buf, &k, oneOff)
			oneOff++
			if _, st := c.Lookup(&k, now); st == Miss {
				if err := c.Store(&k, buf, now); err != nil {
					t.Fatal(err)
				}
			}
		}
		buf = zn.reply(buf, &k, z.next())
		_, st := c.Lookup(&k, now)
		if i >= zipfQueries/4 {
			counted++
			if st == Fresh {
				hits++
			}
		}
		if st == Miss {
			if err := c.Store(&k, buf, now); err != nil {
				t.Fatal(err)
			}
		}
		now = now.Add(time.Millisecond) // far inside every TTL
	}
	if share := float64(oneOff) / float64(oneOff+zipfQueries); flood > 0 && (share < flood-0.01 || share > flood+0.01) {
		t.Fatalf("one-off names were %.3f of all queries, want %.2f", share, flood)
	}
	if oneOff > 999999 {
		t.Fatal("more one-off names than six digits hold")
	}
	checkInvariants(t, c)
	return float64(hits) / float64(counted)
}

func TestScanKeepsHotNames(t *testing.T) {
	const setSize, queries = 20000, 200000
	calm := scanRun(t, setSize, queries, 0)
	flooded := scanRun(t, setSize, queries, 0.5)
	t.Logf("Zipf hit rate, cache at 10%% of %d names: %.1f%% alone, %.1f%% with half of all queries one-off names", setSize, 100*calm, 100*flooded)
	if calm < 0.5 {
		t.Fatalf("hit rate %.1f%% without the flood: the cache is not caching", 100*calm)
	}
	if calm-flooded > 0.05 {
		t.Fatalf("the flood cost %.1f points of hit rate, more than 5", 100*(calm-flooded))
	}
}

// checkInvariants checks every shard of c: its index and queues hold the
// same entries, their bytes add up, the index's table is within the load
// the bound counts on, and the bound holds.
func checkInvariants(t testing.TB, c *Cache) {
	t.Helper()
	var total int64
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n, bytes := 0, int64(0)
		for _, q := range []*queue{&s.small, &s.main} {
			qn, qb := 0, int64(0)
			for e := q.head; e != nil; e = e.next {
				if s.find(e.hash) != e || s.queueOf(e) != q {
					t.Errorf("shard %d: an entry in a queue is not in the index, or on another queue", i)
				}
				qn++
				qb += e.cost()
			}
			if qn != q.len || qb != q.bytes {
				t.Errorf("shard %d: queue of %d entries, %d bytes, says %d, %d", i, qn, qb, q.len, q.bytes)
			}
			n += qn
			bytes += qb
		}
		live, used := indexCounts(s.tab.Load())
		if n != live || live != s.live || used != s.used {
			t.Errorf("shard %d: %d entries queued; the index holds %d and %d with tombstones, says %d and %d", i, n, live, used, s.live, s.used)
		}
		if size := len(s.tab.Load().slots); 2*size > max(2*minSlots, 5*live) || 4*used > 3*size {
			t.Errorf("shard %d: an index of %d slots for %d entries, %d with tombstones", i, size, live, used)
		}
		if bytes > s.budget {
			t.Errorf("shard %d: %d bytes, over its budget of %d", i, bytes, s.budget)
		}
		total += bytes + s.reserved()
		s.mu.Unlock()
	}
	if total > c.cfg.Size {
		t.Errorf("%d bytes held, over the Size %d", total, c.cfg.Size)
	}
	if st := c.Stats(); st.Bytes != total {
		t.Errorf("Stats says %d bytes, the shards hold %d", st.Bytes, total)
	}
}

// indexCounts returns the slots of t that hold an entry, and those that
// hold an entry or a tombstone.
func indexCounts(t *table) (live, used int) {
	for i := range t.slots {
		switch e := t.slots[i].e.Load(); {
		case e == tombstone:
			used++
		case e != nil:
			live++
			used++
		}
	}
	return live, used
}
