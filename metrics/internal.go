package metrics

import "github.com/prometheus/client_golang/prometheus"

// Internals are what parts of the proxy count of themselves that no
// query's outcome shows: each says the proxy itself was held up somewhere.
// The metrics read them at every scrape.
type Internals struct {
	LogDropped   uint64 // log lines dropped: stderr did not take them and their queue was full
	LateHedges   uint64 // hedges not sent: the hedging goroutine reached them after their query's deadline
	ForcedCloses uint64 // TCP connections closed at once: maxLingering graceful closes were under way
}

// WatchInternals exports the Internals read returns, from zero.
func (m *Metrics) WatchInternals(read func() Internals) {
	m.Registry.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: namespace, Name: "log_dropped_total",
			Help: "Log lines (breaker transitions, warnings) dropped because stderr did not take them and 256 were already waiting. " +
				"Above 0: whatever reads stderr (journald, a pipe) stalls or lags; see to it, the lines are lost.",
		}, func() float64 { return float64(read().LogDropped) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: namespace, Name: "late_hedges_total",
			Help: "Hedges not sent because the hedging goroutine reached them only after their query's deadline. " +
				"Above 0: the process stalled for a tenth of DNS_UPSTREAM_TIMEOUT or more; check its CPU limit and the host's load.",
		}, func() float64 { return float64(read().LateHedges) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: namespace, Name: "tcp_forced_closes_total",
			Help: "TCP connections closed at once, not gracefully, because 64 graceful closes were under way: a client with bytes unread gets a reset and may lose its last answers. " +
				"Above 0: connections are closed for newcomers faster than clients let go of them; raise DNS_TCP_MAX_CONNS, or look for a connection flood.",
		}, func() float64 { return float64(read().ForcedCloses) }),
	)
}
