package metrics

import "github.com/prometheus/client_golang/prometheus"

// Upstream is one upstream's series, resolved once so that counting is an
// atomic add: every per-upstream series carries the upstream label, with
// one upstream too, so rules and dashboards see one shape.
type Upstream struct {
	Requests [3]prometheus.Counter // by result, in UpstreamResults' order
	Duration prometheus.Observer
	State    prometheus.Gauge
	changes  [3][3]prometheus.Counter // [from][to], in States' order
}

// Upstream declares the series of the upstream named name (its configured
// address), every label combination at zero, and returns them.
func (m *Metrics) Upstream(name string) *Upstream {
	u := &Upstream{
		Duration: m.UpstreamDuration.WithLabelValues(name),
		State:    m.BreakerState.WithLabelValues(name),
	}
	for i, r := range UpstreamResults {
		u.Requests[i] = m.UpstreamRequests.WithLabelValues(name, r)
	}
	for i, from := range States {
		for j, to := range States {
			if i != j {
				u.changes[i][j] = m.BreakerChanges.WithLabelValues(name, from, to)
			}
		}
	}
	return u
}

// BreakerChanged counts a transition of the upstream's breaker and sets
// its state gauge; from and to index States (guard.State's values).
func (u *Upstream) BreakerChanged(from, to int) {
	u.changes[from][to].Inc()
	u.State.Set(float64(to))
}

// UpstreamStats is what an upstream client counts itself; the metrics read
// it at every scrape.
type UpstreamStats struct {
	CaseMismatches uint64 // replies ignored: their question came back in another letter case
	CaseFetches    uint64 // queries fetched over TCP: their reply came in another case from an upstream known to echo case
	Rotations      uint64 // UDP sockets replaced by one on a fresh random port
	Case0x20       bool   // the query name's letter case is randomised (0x20)
}

// WatchUpstreams exports the upstream clients' own counts, read at scrape
// time: read(i) for names[i], under the upstream label.
func (m *Metrics) WatchUpstreams(names []string, read func(i int) UpstreamStats) {
	m.Registry.MustRegister(&upstreamStats{names: names, read: read})
}

var (
	caseMismatchesDesc = prometheus.NewDesc(namespace+"_upstream_case_mismatches_total",
		"Upstream replies ignored because their question came back in another letter case (0x20): forged, or an upstream that does not echo case.",
		[]string{"upstream"}, nil)
	caseFetchesDesc = prometheus.NewDesc(namespace+"_upstream_case_tcp_fetches_total",
		"Upstream queries fetched over TCP because their UDP reply came back in another letter case (0x20) from an upstream known to echo case: a backend behind it that does not echo case, or a forger.",
		[]string{"upstream"}, nil)
	rotationsDesc = prometheus.NewDesc(namespace+"_upstream_socket_rotations_total",
		"Upstream UDP sockets replaced by one on a fresh random source port.",
		[]string{"upstream"}, nil)
	case0x20Desc = prometheus.NewDesc(namespace+"_upstream_0x20",
		"1 while the query name's letter case is randomised upstream (0x20); 0 when off or switched off for an upstream that does not echo case.",
		[]string{"upstream"}, nil)
)

// upstreamStats collects UpstreamStats for every upstream at scrape time.
type upstreamStats struct {
	names []string
	read  func(i int) UpstreamStats
}

func (c *upstreamStats) Describe(ch chan<- *prometheus.Desc) {
	ch <- caseMismatchesDesc
	ch <- caseFetchesDesc
	ch <- rotationsDesc
	ch <- case0x20Desc
}

func (c *upstreamStats) Collect(ch chan<- prometheus.Metric) {
	for i, name := range c.names {
		s := c.read(i)
		on := 0.0
		if s.Case0x20 {
			on = 1
		}
		ch <- prometheus.MustNewConstMetric(caseMismatchesDesc, prometheus.CounterValue, float64(s.CaseMismatches), name)
		ch <- prometheus.MustNewConstMetric(caseFetchesDesc, prometheus.CounterValue, float64(s.CaseFetches), name)
		ch <- prometheus.MustNewConstMetric(rotationsDesc, prometheus.CounterValue, float64(s.Rotations), name)
		ch <- prometheus.MustNewConstMetric(case0x20Desc, prometheus.GaugeValue, on, name)
	}
}
