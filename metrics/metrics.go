// Package metrics declares dnsproxi's Prometheus collectors, once, and
// serves them on /metrics. No label ever carries a client address or a
// query name: those are decision dimensions, not metric dimensions.
package metrics

import (
	"net/http"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const namespace = "dnsproxi"

// Outcome is how a query ended: a value of the outcome label.
type Outcome int

// The outcomes.
const (
	Forwarded       Outcome = iota // the upstream's reply was relayed
	RateLimited                    // refused by the entry gate: dropped
	BreakerOpen                    // refused by the forward gate: SERVFAIL at once
	UpstreamError                  // timeout, network error or no valid reply: SERVFAIL
	Overloaded                     // too many queries in flight: REFUSED at once
	FormErr                        // not a single question: FORMERR
	NotImp                         // an opcode other than QUERY, or a query signed with TSIG or SIG(0): NOTIMP
	TransferRefused                // a zone transfer (AXFR, IXFR): REFUSED, never relayed cut off
	Denied                         // a client outside the access list: REFUSED, or over UDP beyond its bucket dropped
	ClientLimited                  // refused by the client's own bucket: as DNS_LIMIT_ACTION says
	Cached                         // answered from the cache, TTLs counted down; nothing sent upstream
	Stale                          // answered from an expired cache entry (RFC 8767): TTL 30, EDE 3 or 19
	UpstreamLimited                // an attempt refused by the outbound limit (its first, or a re-send of the upstream layer's own): REFUSED
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"forwarded", "rate_limited", "breaker_open", "upstream_error", "overloaded", "formerr", "notimp", "transfer_refused",
	"denied", "client_limited", "cached", "stale", "upstream_limited"}

// String returns the outcome's label value.
func (o Outcome) String() string { return outcomeNames[o] }

// Outcomes lists every outcome's label value, in the order dashboards show them.
var Outcomes = outcomeNames[:]

// QTypes lists the query types counted under their own name; any other is "OTHER".
var QTypes = []uint16{
	dns.TypeA, dns.TypeAAAA, dns.TypeCNAME, dns.TypeMX, dns.TypeNS, dns.TypePTR, dns.TypeSOA,
	dns.TypeSRV, dns.TypeTXT, dns.TypeHTTPS, dns.TypeSVCB, dns.TypeCAA, dns.TypeDS, dns.TypeDNSKEY, dns.TypeANY,
}

// OtherQType is the qtype label of every type not in QTypes.
const OtherQType = "OTHER"

// States are the breaker's states, in the order of guard.State's values,
// which is also what the breaker_state gauge holds.
var States = []string{"closed", "half-open", "open"}

// UpstreamResults are the values of upstream_requests_total's result label,
// in the order of pool.AttemptResult's values.
var UpstreamResults = []string{"answer", "timeout", "error"}

// RetryReasons are the values of retries_total's reason label, in the
// order of pool.Reason's values.
var RetryReasons = []string{"failure", "answer", "hedge"}

// Metrics holds the collectors of one proxy. Build it once with New.
type Metrics struct {
	Registry *prometheus.Registry

	Queries          *prometheus.CounterVec
	RequestDuration  prometheus.Histogram
	UpstreamDuration *prometheus.HistogramVec // {upstream}
	InFlight         prometheus.Gauge
	BreakerState     *prometheus.GaugeVec   // {upstream}
	BreakerChanges   *prometheus.CounterVec // {upstream, from, to}
	Dropped          *prometheus.CounterVec
	Coalesced        prometheus.Counter

	UpstreamRequests     *prometheus.CounterVec // {upstream, result}
	Retries              *prometheus.CounterVec // {reason}
	RetryBudgetExhausted prometheus.Counter

	byType map[uint16]int                    // query type → row of counts
	counts [][numOutcomes]prometheus.Counter // [qtype row][outcome]: resolved once, so counting is one atomic add
}

// New declares the collectors on a fresh registry, with the Go and process
// collectors beside them, and sets every known label combination to zero.
// The breaker's series are declared but not served until EnableBreaker.
func New() *Metrics {
	buckets := []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "queries_total",
			Help: "Queries handled, by query type and by how they ended.",
		}, []string{"qtype", "outcome"}),
		RequestDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "request_duration_seconds",
			Help: "Time from a query's arrival to its answer (or its drop).", Buckets: buckets,
		}),
		UpstreamDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "upstream_duration_seconds",
			Help: "Time one attempt at an upstream took, successful or not, by upstream.", Buckets: buckets,
		}, []string{"upstream"}),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "queries_in_flight",
			Help: "Queries between the forward gate and their answer.",
		}),
		BreakerState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Name: "breaker_state",
			Help: "Each upstream's circuit breaker state: 0 closed, 1 half-open, 2 open.",
		}, []string{"upstream"}),
		BreakerChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "breaker_transitions_total",
			Help: "Circuit breaker state changes, by upstream, by the state left and the state entered.",
		}, []string{"upstream", "from", "to"}),
		UpstreamRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "upstream_requests_total",
			Help: "Attempts at each upstream (first attempts, retries and hedges), by how they ended.",
		}, []string{"upstream", "result"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "retries_total",
			Help: "Second attempts sent to another upstream, by why: a fast failure, a SERVFAIL or REFUSED answer, or a hedge.",
		}, []string{"reason"}),
		RetryBudgetExhausted: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "retry_budget_exhausted_total",
			Help: "Retries and hedges not sent because the retry budget was spent.",
		}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "server_dropped_total",
			Help: "Packets and connections the server answered or dropped before the handler, by reason.",
		}, []string{"reason"}),
		Coalesced: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Name: "coalesced_total",
			Help: "Queries that waited for the answer to an identical query in flight instead of asking the upstream.",
		}),
		byType: make(map[uint16]int, len(QTypes)),
	}
	rows := make([]string, 0, len(QTypes)+1)
	for i, t := range QTypes {
		m.byType[t] = i
		rows = append(rows, dns.TypeToString[t])
	}
	rows = append(rows, OtherQType)
	for _, qtype := range rows {
		var row [numOutcomes]prometheus.Counter
		for j, o := range Outcomes {
			row[j] = m.Queries.WithLabelValues(qtype, o) // every combination starts at 0
		}
		m.counts = append(m.counts, row)
	}
	for _, r := range RetryReasons {
		m.Retries.WithLabelValues(r)
	}
	for _, r := range []string{"malformed", "response", "overloaded", "tcp_conn_limit", "tcp_idle_evicted", "tcp_slow_reader"} {
		m.Dropped.WithLabelValues(r)
	}
	m.Registry.MustRegister(m.Queries, m.RequestDuration, m.UpstreamDuration, m.InFlight,
		m.Dropped, m.Coalesced, m.UpstreamRequests, m.Retries, m.RetryBudgetExhausted,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// EnableBreaker serves the breaker's series. A proxy without a breaker
// leaves them out, so that a breaker that is off never reads as closed.
func (m *Metrics) EnableBreaker() {
	m.Registry.MustRegister(m.BreakerState, m.BreakerChanges)
}

// BuildInfo serves dnsproxi_build_info, 1, labelled with what dnsproxi
// -version prints: the module version, the VCS revision and the Go version.
func (m *Metrics) BuildInfo(version, revision, goVersion string) {
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "build_info",
		Help:        "Always 1; its labels say which build is running: module version, VCS revision, Go version.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "goversion": goVersion},
	})
	info.Set(1)
	m.Registry.MustRegister(info)
}

// InFlightLimit serves the cap on queries in flight (DNS_MAX_INFLIGHT; 0:
// none) beside the gauge it caps, for alerts on how near it is.
func (m *Metrics) InFlightLimit(limit int) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Name: "queries_in_flight_limit",
		Help: "The cap on queries in flight (DNS_MAX_INFLIGHT); beyond it queries are REFUSED (overloaded). 0: no cap.",
	})
	g.Set(float64(limit))
	m.Registry.MustRegister(g)
}

// QType returns the row of counts for query type t: its own, or OTHER's.
func (m *Metrics) QType(t uint16) QTypeRow {
	if i, ok := m.byType[t]; ok {
		return QTypeRow(i)
	}
	return QTypeRow(len(QTypes))
}

// QTypeRow picks a query type's counts; get one from QType.
type QTypeRow int

// OtherRow is the row of the types counted as OTHER.
var OtherRow = QTypeRow(len(QTypes))

// Count adds one query of type row with outcome.
func (m *Metrics) Count(row QTypeRow, outcome Outcome) {
	m.counts[row][outcome].Inc()
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
}

// ClientStats is what the per-client table counts itself; the metrics read
// it at every scrape. All zero while the per-client gate is off.
type ClientStats struct {
	Entries   int    // prefixes holding a slot
	Evictions uint64 // full buckets that gave their slot to a new prefix
	Overflows uint64 // queries whose prefix found no slot and shared the overflow bucket
}

// WatchClients exports the per-client table's counts, read at scrape time.
// No series carries a client's address or prefix.
func (m *Metrics) WatchClients(read func() ClientStats) {
	m.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: namespace, Name: "client_table_entries",
			Help: "Client prefixes holding a bucket in the per-client tables, UDP's and TCP's together (at most DNS_CLIENT_TABLE_SIZE each).",
		}, func() float64 { return float64(read().Entries) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: namespace, Name: "client_table_evictions_total",
			Help: "Full (idle) client buckets that gave their slot to a new prefix.",
		}, func() float64 { return float64(read().Evictions) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: namespace, Name: "client_overflow_total",
			Help: "Queries whose client prefix found the table full of busy buckets and shared the overflow bucket.",
		}, func() float64 { return float64(read().Overflows) }),
	)
}

// WatchQueryLog exports the query log's counts, read at scrape time: lines
// written, and lines dropped (no room in its buffer, or a failed write).
func (m *Metrics) WatchQueryLog(read func() (written, dropped uint64)) {
	m.Registry.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: namespace, Name: "query_log_lines_total",
			Help: "Query log lines written.",
		}, func() float64 { w, _ := read(); return float64(w) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: namespace, Name: "query_log_dropped_total",
			Help: "Query log lines dropped: no room in its buffer (the writer fell behind), or a write that failed.",
		}, func() float64 { _, d := read(); return float64(d) }),
	)
}
