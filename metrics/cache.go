package metrics

import "github.com/prometheus/client_golang/prometheus"

// CacheStats is what the answer cache counts itself; the metrics read it
// at every scrape. All zero while the cache is off.
type CacheStats struct {
	Entries   int    // answers held
	Bytes     int64  // what DNS_CACHE_SIZE bounds: stored bytes, per-entry overhead, ghost tables
	Evictions uint64 // entries evicted to make room
}

// RefreshResult is how one refresh of a cached answer ended: of an expired
// entry (serve-stale) or of one prefetched in the last tenth of its TTL.
type RefreshResult int

// The refresh results.
const (
	RefreshUpdated   RefreshResult = iota // the upstream answered and the answer was stored
	RefreshNotStored                      // the upstream answered with what is not cached (TTL 0, TC, REFUSED...)
	RefreshFailed                         // no usable answer (a failure, SERVFAIL): stale served, recheck in 30 s
	RefreshRefused                        // never sent: the in-flight cap, a breaker, the outbound limit, no free ID, a full send queue
	numRefreshResults
)

var refreshNames = [numRefreshResults]string{"updated", "not_stored", "failed", "refused"}

// String returns the result's label value.
func (r RefreshResult) String() string { return refreshNames[r] }

// Refreshes counts refreshes of cached answers by result. Build it with
// WatchCache.
type Refreshes struct {
	counts [numRefreshResults]prometheus.Counter
}

// Count adds one refresh that ended with r.
func (c *Refreshes) Count(r RefreshResult) { c.counts[r].Inc() }

// WatchCache exports the answer cache's counts, read at scrape time, and
// returns the counter of its refreshes, every result starting at 0.
func (m *Metrics) WatchCache(read func() CacheStats) *Refreshes {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Name: "cache_refreshes_total",
		Help: "Refreshes of cached answers (expired ones under serve-stale, prefetched ones), by how they ended.",
	}, []string{"result"})
	r := &Refreshes{}
	for i, name := range refreshNames {
		r.counts[i] = vec.WithLabelValues(name)
	}
	m.Registry.MustRegister(vec,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Name: "cache_entries",
			Help: "Answers held in the cache.",
		}, func() float64 { return float64(read().Entries) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Name: "cache_bytes",
			Help: "Bytes the cache counts against DNS_CACHE_SIZE: stored answers, their per-entry overhead, the ghost tables.",
		}, func() float64 { return float64(read().Bytes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: namespace, Name: "cache_evictions_total",
			Help: "Cached answers evicted to make room for others.",
		}, func() float64 { return float64(read().Evictions) }),
	)
	return r
}
