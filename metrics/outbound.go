package metrics

import "github.com/prometheus/client_golang/prometheus"

// OutboundModes are the values of upstream_ratelimit_mode's mode label.
var OutboundModes = []string{"shared", "local"}

// RedisResults are the values of upstream_ratelimit_redis_calls_total's
// result label: answered in time, failed, ran past the timeout.
var RedisResults = []string{"ok", "error", "timeout"}

// OutboundStats is what the fleet's outbound limiter counts itself; the
// metrics read it at every scrape.
type OutboundStats struct {
	Shared      bool      // spending leases from the fleet's bucket on Redis; false: a local share
	RedisCalls  [3]uint64 // by result, in RedisResults' order
	Instances   int       // the fleet's size last seen on Redis, 0 before it answered
	LeaseTokens int64     // tokens in hand from the fleet's bucket
}

// WatchOutbound exports the fleet limiter's state, read once per scrape.
// It is called only when the outbound limit is shared on Redis: a limit
// local to one instance has no mode to report.
func (m *Metrics) WatchOutbound(read func() OutboundStats) {
	m.Registry.MustRegister(&outboundStats{read: read})
}

var (
	outboundModeDesc = prometheus.NewDesc(namespace+"_upstream_ratelimit_mode",
		"1 for where the outbound limit's tokens come from now: shared (leases from the fleet's bucket on Redis) or local (this instance's share, Redis failing or slow).",
		[]string{"mode"}, nil)
	redisCallsDesc = prometheus.NewDesc(namespace+"_upstream_ratelimit_redis_calls_total",
		"Calls the outbound limit made to Redis, by result: ok, error, or timeout (slower than DNS_UPSTREAM_RATE_LIMIT_REDIS_TIMEOUT).",
		[]string{"result"}, nil)
	fleetInstancesDesc = prometheus.NewDesc(namespace+"_upstream_ratelimit_fleet_instances",
		"Instances sharing the outbound limit, as last seen on Redis (this one included); 0 before Redis answered.",
		nil, nil)
	leaseTokensDesc = prometheus.NewDesc(namespace+"_upstream_ratelimit_lease_tokens",
		"Tokens this instance holds leased from the fleet's bucket.",
		nil, nil)
)

// outboundStats collects OutboundStats at scrape time.
type outboundStats struct {
	read func() OutboundStats
}

func (c *outboundStats) Describe(ch chan<- *prometheus.Desc) {
	ch <- outboundModeDesc
	ch <- redisCallsDesc
	ch <- fleetInstancesDesc
	ch <- leaseTokensDesc
}

func (c *outboundStats) Collect(ch chan<- prometheus.Metric) {
	s := c.read()
	shared := 0.0
	if s.Shared {
		shared = 1
	}
	ch <- prometheus.MustNewConstMetric(outboundModeDesc, prometheus.GaugeValue, shared, OutboundModes[0])
	ch <- prometheus.MustNewConstMetric(outboundModeDesc, prometheus.GaugeValue, 1-shared, OutboundModes[1])
	for i, r := range RedisResults {
		ch <- prometheus.MustNewConstMetric(redisCallsDesc, prometheus.CounterValue, float64(s.RedisCalls[i]), r)
	}
	ch <- prometheus.MustNewConstMetric(fleetInstancesDesc, prometheus.GaugeValue, float64(s.Instances))
	ch <- prometheus.MustNewConstMetric(leaseTokensDesc, prometheus.GaugeValue, float64(s.LeaseTokens))
}
