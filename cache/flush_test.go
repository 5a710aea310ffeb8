package cache

import (
	"fmt"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// A flush empties the cache of stale answers too: an expired entry that a
// refresh carries as its fallback, found before the flush, is not servable
// after it, however far inside its stale window. (The operator flushes to
// stop the answers held; before, a refresh in flight at the flush that then
// failed, or whose stale-wait timer fired, served the flushed answer stale.)
func TestFlushEndsTheStaleAnswersRefreshesCarry(t *testing.T) {
	c := newCache(t, Config{StaleWindow: time.Hour})
	h, k := expiredHit(t, c)
	if !c.Servable(h, at(62*time.Second)) {
		t.Fatal("before the flush: not servable; want servable")
	}
	c.Flush()
	if c.Servable(h, at(62*time.Second)) {
		t.Fatal("a Hit found before the flush is still servable after it: the flushed answer would be served stale")
	}
	q := query("www.example.com.", dns.TypeA, 0)
	if err := c.Store(k, pack(t, answer(t, q, dns.RcodeSuccess, []string{"www.example.com. 60 IN A 192.0.2.2"}, nil, nil)), at(63*time.Second)); err != nil {
		t.Fatal(err)
	}
	h, st := c.Lookup(k, at(124*time.Second))
	if st != Expired || !c.Servable(h, at(125*time.Second)) {
		t.Fatalf("an entry stored after the flush: %v, servable %v; want expired and servable", st, c.Servable(h, at(125*time.Second)))
	}
}

// A flush ends the stale answers of entries that had already left the
// cache when it came, too: a Hit whose entry was evicted while its refresh
// was in flight (a full cache, a slow upstream) is no longer servable after
// a flush, as Flush promises of every Hit found before it. Before, only
// the entries still queued at the flush were marked.
func TestFlushEndsTheStaleAnswerOfAnEvictedEntry(t *testing.T) {
	c := newCache(t, Config{Size: MinSize, StaleWindow: time.Hour})
	h, k := expiredHit(t, c)
	for i := 0; i < 100000; i++ { // other names fill the cache until it is evicted
		if e := c.shardOf(k.Hash).find(k.Hash); e == nil || e != h.e { // looked at without a hit
			break
		}
		name := fmt.Sprintf("n%d.example.com.", i)
		o := query(name, dns.TypeA, 0)
		ko := keyOf(t, o)
		if err := c.Store(ko, pack(t, answer(t, o, dns.RcodeSuccess, []string{name + " 600 IN A 192.0.2.2"}, nil, nil)), at(62*time.Second)); err != nil {
			t.Fatal(err)
		}
		c.Lookup(ko, at(62*time.Second)) // hit, so it goes on to the main queue

	}
	if _, st := c.Lookup(k, at(62*time.Second)); st != Miss {
		t.Fatalf("the entry was not evicted: %v", st)
	}
	if !c.Servable(h, at(62*time.Second)) {
		t.Fatal("an evicted entry's Hit is not servable before any flush")
	}
	c.Flush()
	if c.Servable(h, at(62*time.Second)) {
		t.Fatal("a Hit found before the flush, its entry evicted before it, is still servable after it: the flushed answer would be served stale")
	}
}

// The prefetch mark and the flush count share a word: neither hides the
// other. A Hit told to prefetch is still not servable after a flush, and
// the entry stored after it is servable and told to prefetch once.
func TestFlushAndPrefetchShareTheMarks(t *testing.T) {
	q := query("www.example.com.", dns.TypeA, 0)
	c := newCache(t, Config{StaleWindow: time.Hour, Prefetch: true})
	k := keyOf(t, q)
	store := func(at0 time.Duration) {
		t.Helper()
		if err := c.Store(k, pack(t, answer(t, q, dns.RcodeSuccess, []string{"www.example.com. 100 IN A 192.0.2.1"}, nil, nil)), at(at0)); err != nil {
			t.Fatal(err)
		}
	}
	store(0)
	h, st := c.Lookup(k, at(95*time.Second)) // the last tenth: prefetch
	if st != Fresh || !h.Prefetch() || !c.Servable(h, at(95*time.Second)) {
		t.Fatalf("before the flush: %v, prefetch %v, servable %v; want fresh, true, true", st, h.Prefetch(), c.Servable(h, at(95*time.Second)))
	}
	for range 3 {
		c.Flush()
	}
	if c.Servable(h, at(96*time.Second)) {
		t.Fatal("a Hit told to prefetch is servable after three flushes")
	}
	store(96 * time.Second)
	h, _ = c.Lookup(k, at(191*time.Second))
	h2, _ := c.Lookup(k, at(192*time.Second))
	if !h.Prefetch() || h2.Prefetch() || !c.Servable(h2, at(192*time.Second)) {
		t.Fatalf("stored after the flushes: prefetch %v then %v, servable %v; want true, false, true", h.Prefetch(), h2.Prefetch(), c.Servable(h2, at(192*time.Second)))
	}
}
