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

// The outcomes a query can end with: the values of the outcome label.
const (
	Forwarded     = "forwarded"      // the upstream's reply was relayed
	RateLimited   = "rate_limited"   // refused by the entry gate
	BreakerOpen   = "breaker_open"   // refused by the forward gate: SERVFAIL at once
	UpstreamError = "upstream_error" // timeout, network error or no valid reply: SERVFAIL
	Overloaded    = "overloaded"     // too many queries in flight: REFUSED at once
	FormErr       = "formerr"        // the query could not be parsed or had no single question
	NotImp        = "notimp"         // an opcode other than QUERY
)

// Outcomes lists every outcome, in the order dashboards show them.
var Outcomes = []string{Forwarded, RateLimited, BreakerOpen, UpstreamError, Overloaded, FormErr, NotImp}

// QTypes lists the query types counted under their own name; any other is "OTHER".
var QTypes = []uint16{
	dns.TypeA, dns.TypeAAAA, dns.TypeCNAME, dns.TypeMX, dns.TypeNS, dns.TypePTR, dns.TypeSOA,
	dns.TypeSRV, dns.TypeTXT, dns.TypeHTTPS, dns.TypeSVCB, dns.TypeCAA, dns.TypeDS, dns.TypeDNSKEY, dns.TypeANY,
}

// OtherQType is the qtype label of every type not in QTypes.
const OtherQType = "OTHER"

// States are the breaker's states as the breaker_state gauge encodes them.
var States = []string{"closed", "half-open", "open"}

// Metrics holds the collectors of one proxy. Build it once with New.
type Metrics struct {
	Registry *prometheus.Registry

	Queries          *prometheus.CounterVec
	RequestDuration  prometheus.Histogram
	UpstreamDuration prometheus.Histogram
	InFlight         prometheus.Gauge
	BreakerState     prometheus.Gauge
	BreakerChanges   *prometheus.CounterVec
	Dropped          *prometheus.CounterVec

	byType map[uint16]string
}

// New declares the collectors on a fresh registry, with the Go and process
// collectors beside them, and sets every known label combination to zero.
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
		UpstreamDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "upstream_duration_seconds",
			Help: "Time one upstream exchange took, successful or not.", Buckets: buckets,
		}),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "queries_in_flight",
			Help: "Queries between the forward gate and their answer.",
		}),
		BreakerState: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Name: "breaker_state",
			Help: "The circuit breaker's state: 0 closed, 1 half-open, 2 open.",
		}),
		BreakerChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "breaker_transitions_total",
			Help: "Circuit breaker state changes, by the state left and the state entered.",
		}, []string{"from", "to"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "server_dropped_total",
			Help: "Packets and connections the server answered or dropped before the handler, by reason.",
		}, []string{"reason"}),
		byType: make(map[uint16]string, len(QTypes)),
	}
	for _, t := range QTypes {
		m.byType[t] = dns.TypeToString[t]
	}
	for _, o := range Outcomes {
		for _, t := range QTypes {
			m.Queries.WithLabelValues(dns.TypeToString[t], o)
		}
		m.Queries.WithLabelValues(OtherQType, o)
	}
	for _, from := range States {
		for _, to := range States {
			if from != to {
				m.BreakerChanges.WithLabelValues(from, to)
			}
		}
	}
	for _, r := range []string{"malformed", "response", "overloaded", "tcp_conn_limit"} {
		m.Dropped.WithLabelValues(r)
	}
	m.Registry.MustRegister(m.Queries, m.RequestDuration, m.UpstreamDuration, m.InFlight,
		m.BreakerState, m.BreakerChanges, m.Dropped,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// QType returns the qtype label for t.
func (m *Metrics) QType(t uint16) string {
	if s, ok := m.byType[t]; ok {
		return s
	}
	return OtherQType
}

// Count adds one query of type qtype (a label from QType) with outcome.
func (m *Metrics) Count(qtype, outcome string) {
	m.Queries.WithLabelValues(qtype, outcome).Inc()
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
}

// StateValue is the breaker_state gauge's value for the state named s.
func StateValue(s string) float64 {
	for i, name := range States {
		if name == s {
			return float64(i)
		}
	}
	return -1
}
