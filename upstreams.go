package main

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"dnsproxi/guard"
	"dnsproxi/internal/batchio"
	"dnsproxi/metrics"
	"dnsproxi/pool"
	"dnsproxi/upstream"
)

// newUpstreams builds the set of upstreams cfg lists: for each, its own
// sockets, its own breaker (when DNS_BREAKER_THRESHOLD is set) and its own
// series; then the policy, the retry budget and the hedge over them.
// Breakers and the budget read clock; the deadlines and hedges read the
// real clock, the one the upstream sockets' deadlines are on.
// replies is held by the upstreams' readers while they hand out a batch;
// queries gets the upstreams' UDP writers.
func newUpstreams(cfg Config, clock guard.Clock, m *metrics.Metrics, log *slog.Logger, replies, queries *batchio.Group) (*pool.Pool, error) {
	outbound, err := newOutbound(cfg, clock, m, log) // outbound.go; the pool closes it
	if err != nil {
		return nil, err
	}
	// What an upstream sends on its own (a query sent again, the TCP fetch,
	// 0x20 probes) pays the outbound limit as the pool's attempts do.
	var allowExtra func() bool
	if outbound != nil {
		allowExtra = func() bool { return outbound.Allow(1) }
	}
	names := cfg.Upstreams()
	members := make([]pool.Member, 0, len(names))
	clients := make([]*upstream.Upstream, 0, len(names))
	obs := &poolMetrics{m: m}
	for _, name := range names {
		up, err := upstream.New(upstream.Config{
			Addr:        name,
			Timeout:     cfg.UpstreamTimeout,
			Disable0x20: !cfg.Upstream0x20,
			AvoidPorts:  ownPorts(cfg),
			Replies:     replies,
			Queries:     queries,
			AllowExtra:  allowExtra,
			OnCaseFallback: func() {
				log.Warn("upstream does not echo the query name's letter case: 0x20 is off for it from now on",
					"upstream", name)
			},
		})
		if err != nil {
			for _, c := range clients {
				c.Close()
			}
			if c, ok := outbound.(io.Closer); ok {
				c.Close()
			}
			return nil, err
		}
		clients = append(clients, up)
		series := m.Upstream(name)
		obs.upstreams = append(obs.upstreams, series)
		breaker := newBreaker(cfg, clock)
		if breaker != nil {
			breaker.OnStateChange(func(from, to guard.State) {
				series.BreakerChanged(int(from), int(to)) // guard.State counts closed, half-open, open: as metrics.States
				log.Info("breaker", "upstream", name, "from", from.String(), "to", to.String())
			})
		}
		members = append(members, pool.Member{Name: name, Upstream: up, Breaker: breaker})
	}
	m.WatchUpstreams(names, func(i int) metrics.UpstreamStats {
		s := clients[i].Stats()
		return metrics.UpstreamStats{CaseMismatches: s.CaseMismatches, CaseFetches: s.CaseFetches, Rotations: s.Rotations,
			Case0x20: cfg.Upstream0x20 && !s.PlainCase}
	})
	var budget *guard.RetryBudget
	if cfg.RetryBudget > 0 {
		budget = guard.NewRetryBudget(guard.RetryBudgetConfig{Ratio: float64(cfg.RetryBudget) / 100}, clock)
	}
	return pool.New(pool.Config{
		Members:  members,
		Policy:   pool.Policy(cfg.UpstreamPolicy),
		Timeout:  cfg.UpstreamTimeout,
		Hedge:    cfg.UpstreamHedge.After,
		Budget:   budget,
		Valid:    validReply,
		Observer: obs,
		Clock:    guard.RealClock{},
		Outbound: outbound,
	})
}

// newBreaker builds one upstream's breaker as cfg asks; nil means off.
func newBreaker(cfg Config, clock guard.Clock) *guard.Breaker {
	if cfg.BreakerThreshold == 0 {
		return nil
	}
	return guard.NewBreaker(guard.BreakerConfig{
		Window:        cfg.BreakerWindow,
		MinSamples:    cfg.BreakerMinSamples,
		FailThreshold: float64(cfg.BreakerThreshold) / 100,
		CoolOff:       cfg.BreakerCoolOff,
	}, clock)
}

// poolMetrics counts what the set of upstreams does in /metrics.
type poolMetrics struct {
	m         *metrics.Metrics
	upstreams []*metrics.Upstream // by member index
}

// Attempt counts one attempt at upstream i under its result, with its duration.
func (o *poolMetrics) Attempt(i int, r pool.AttemptResult, took time.Duration) {
	u := o.upstreams[i]
	u.Requests[r].Inc() // pool.AttemptResults and metrics.UpstreamResults share their order
	u.Duration.Observe(took.Seconds())
}

// Retry counts an extra attempt under its reason.
func (o *poolMetrics) Retry(r pool.Reason) {
	o.m.Retries.WithLabelValues(metrics.RetryReasons[r]).Inc()
}

// BudgetExhausted counts a retry or hedge the budget refused.
func (o *poolMetrics) BudgetExhausted() { o.m.RetryBudgetExhausted.Inc() }

// failoverSummary is the set of upstreams as the start-up log line gives it.
func failoverSummary(cfg Config) string {
	n := len(cfg.Upstreams())
	if n == 1 {
		return "one upstream"
	}
	budget := "off"
	if cfg.RetryBudget > 0 {
		budget = fmt.Sprintf("%d%%", cfg.RetryBudget)
	}
	return fmt.Sprintf("%d upstreams, %v, retry budget %s, hedge %v", n, cfg.UpstreamPolicy, budget, cfg.UpstreamHedge)
}
