package main

import (
	"time"

	"dnsproxi/cache"
	"dnsproxi/guard"
	"dnsproxi/internal/wire"
	"dnsproxi/metrics"
)

// The answer cache on the query path (the cache package holds the answers
// and their rules; this file and stale.go decide when to use them):
//
//   - A query that passed the entry gates (a hit still pays its token) is
//     looked up by its query key, the key coalescing uses. A fresh hit is
//     answered at once — the client's ID, question bytes and OPT, every TTL
//     counted down, cut to its size like any answer — and touches neither
//     the in-flight cap nor the breaker: it sends nothing.
//   - Queries with an EDNS Client Subnet option use the cache like any
//     other, for the reason they coalesce (coalesce.go): the proxy never
//     forwards the option, so their answer does not depend on the subnet.
//     The day the option is forwarded, both must skip it together. Zone
//     transfers are refused before the cache.
//   - A miss goes on to the upstream as before; whatever usable answer comes
//     back is stored (the cache decides what is cacheable).
//   - An expired entry (serve-stale on) is refreshed first; the flight
//     carries it as its fallback, answered stale when the refresh cannot
//     give an answer (stale.go).
//   - With prefetch on, the one hit in an entry's last tenth of TTL that
//     the cache picks answers its client from the cache and then goes on,
//     unanswered by anyone, as a refresh through coalescing, the cap, the
//     breaker and the exchange like any query; its answer replaces the entry.

// answerCache is the proxy's answer cache and what it needs beside it.
type answerCache struct {
	store     *cache.Cache
	clock     guard.Clock   // what TTLs and the stale-wait timer count on
	staleWait time.Duration // the client-response timer; 0: wait for the refresh
	refreshes *metrics.Refreshes
}

// newAnswerCache builds the cache cfg asks for and registers its metrics
// (at zero when off). It returns nil when the cache is off.
func newAnswerCache(cfg Config, clock guard.Clock, m *metrics.Metrics) (*answerCache, error) {
	var store *cache.Cache
	if cfg.CacheSize > 0 {
		var err error
		if store, err = cache.New(cacheConfig(cfg)); err != nil {
			return nil, err
		}
	}
	refreshes := m.WatchCache(func() metrics.CacheStats {
		if store == nil {
			return metrics.CacheStats{}
		}
		s := store.Stats()
		return metrics.CacheStats{Entries: s.Entries, Bytes: s.Bytes, Evictions: s.Evictions}
	})
	if store == nil {
		return nil, nil
	}
	return &answerCache{store: store, clock: clock, staleWait: cfg.CacheStaleWait, refreshes: refreshes}, nil
}

// fromCache looks f's query up (keyed: f has a query key) at now and reports
// whether it is done: answered fresh, or stale while its name waits out the
// recheck timer. An expired entry becomes f's fallback and f goes on as its
// refresh; a prefetch hit is answered and f goes on as a refresh with no one
// to answer (its leader's writer cleared).
func (p *proxy) fromCache(f *flight, keyed bool, now time.Time) bool {
	c := p.cache
	if c == nil || !keyed {
		return false
	}
	h, state := c.store.Lookup(&f.key, now)
	switch state {
	case cache.Fresh:
		p.answerAtOnce(f, h, metrics.Cached)
		if h.Prefetch() {
			f.lead.w = nil
			f.cached.refresh, f.cached.overTCP = true, p.tooLargeForUDP(f, h)
			return false
		}
	case cache.Stale:
		p.answerAtOnce(f, h, metrics.Stale)
	case cache.Expired:
		f.cached.fallback, f.cached.refresh, f.cached.overTCP = h, true, p.tooLargeForUDP(f, h)
		return false
	default:
		return false
	}
	f.recycle()
	return true
}

// tooLargeForUDP reports whether the upstream's answer to f's query, as h
// holds it, would not fit the UDP size the proxy offers the upstream (the
// proxy's OPT included): its refresh then asks over TCP. Over UDP the
// upstream would answer TC, which is never stored: a prefetch set off by a
// UDP client (the hit in an entry's last tenth nearly always comes over
// UDP) spent its one try on it and the entry expired as if prefetch were
// off, and an expired entry's refresh cost a wasted round trip
// (TestPrefetchOfALargeAnswerSetOffOverUDPRefreshesIt).
func (p *proxy) tooLargeForUDP(f *flight, h cache.Hit) bool {
	return wire.HeaderLen+f.lead.qlen+h.Len()+wire.OPTLen > p.udpSize()
}

// answerAtOnce answers f's leader from h, counted as outcome o, in f's own
// buffer for its upstream query: nothing is sent for an answer from the
// cache, and a prefetch writes its query over the answer only once the
// answer is written (a writer keeps a copy). A buffer grown past what the
// answer pool keeps is not kept.
func (p *proxy) answerAtOnce(f *flight, h cache.Hit, o metrics.Outcome) {
	wt := &f.lead
	b := p.answerCached(f.query[:0], wt, h, o, p.hitTook(wt.start))
	if cap(b) <= maxKeptBuf {
		f.query = b[:0]
	}
}

// hitTook returns how long a query answered from the cache at once took
// since start, for its metrics: 0, without reading the clock again. Its
// time is the hit path's own, a microsecond or less (0.45 µs measured), a
// hundredth of the request-duration histogram's first bucket (100 µs),
// where 0 counts it too; a second reading of the clock would cost a tenth
// of the hit. The query log, when on, gets the time as measured.
func (p *proxy) hitTook(start time.Time) time.Duration {
	if p.qlog == nil {
		return 0
	}
	return time.Since(start)
}

// writeCached answers wt from h in a buffer of the pool's (answerCached),
// counting the time since its query arrived: a refresh was waited for.
func (p *proxy) writeCached(wt *waiter, h cache.Hit, o metrics.Outcome) {
	bp := getBuf()
	putBuf(bp, p.answerCached((*bp)[:0], wt, h, o, time.Since(wt.start)))
}

// answerCached answers wt from h — its records, TTLs counted down
// (StaleTTL when stale), the client's own header bits, question and OPT,
// with EDE 3 or 19 when stale — cut to wt's size like any answer, and
// counts outcome o, the answer taking d. It builds the answer in dst and
// returns it, grown: the records are copied once, from the cache straight
// into the answer, and their TTLs counted down there.
func (p *proxy) answerCached(dst []byte, wt *waiter, h cache.Hit, o metrics.Outcome, d time.Duration) []byte {
	var ede [6]byte // an EDE option: code, length, info code
	ua := upstreamAnswer{flags: h.Flags(), records: h.Records()}
	if h.Stale() {
		ua.optData = h.AppendStaleEDE(ede[:0])
	}
	ua.an, ua.ns, ua.ar = h.Counts()
	if wire.HeaderLen+wt.qlen+len(ua.records) > wt.size {
		// Records too large for the client's size (a UDP client of an answer
		// a TCP query stored) are not copied only to be cut: the answer is TC
		// at once. Over TCP they always fit, as the reply they came in did.
		ua.flags |= wire.FlagTC
	}
	b := ua.appendFor(dst, wt, p.udpSize())
	// A cached answer is never TC (the cache stores none), so TC here says
	// appendFor cut the sections to fit; otherwise the records follow the
	// question.
	if wire.Flags(b)&wire.FlagTC == 0 {
		at := len(dst) + wire.HeaderLen + wt.qlen
		h.CountDown(b[at : at+len(ua.records)])
	}
	wt.w.Write(b)
	p.recordTook(wt.qtype, o, wt.start, d, wt.client, wt.question(), ua.rcodeFor(b, wt), "")
	return b
}
