package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dnsproxi/guard"
	"dnsproxi/pool"
)

// The outbound limit on one instance: queries beyond it are REFUSED at
// once with EDE 0 "upstream rate limit", counted upstream_limited, and
// never reach the upstream; the bucket refills on its clock. The entry
// gate is another thing: with DNS_RATE_LIMIT off nothing is rate_limited.
func TestUpstreamLimited(t *testing.T) {
	up := startUpstream(t)
	cfg := testConfig(up.Addr())
	cfg.UpstreamRateLimit = RateLimit{Rate: 1, Burst: 2}
	clock := guard.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	a := startProxy(t, cfg, clock)

	want := []int{dns.RcodeSuccess, dns.RcodeSuccess, dns.RcodeRefused, dns.RcodeRefused}
	for i, rcode := range want {
		m := query(fmt.Sprintf("n%d.example.com", i), dns.TypeA) // names of their own: nothing coalesces
		m.SetEdns0(1232, false)
		r := ask(t, "udp", a.addr(), m)
		if r.Rcode != rcode {
			t.Fatalf("query %d: %s, want %s", i, rcodeName(r), dns.RcodeToString[rcode])
		}
		if e, ok := edeOf(r); rcode == dns.RcodeRefused && (!ok || e.InfoCode != dns.ExtendedErrorCodeOther || e.ExtraText != "upstream rate limit") {
			t.Fatalf("query %d: EDE %v, want 0 \"upstream rate limit\"", i, e)
		}
	}
	if got := count(a, "A", "upstream_limited", 2); got != 2 {
		t.Errorf("upstream_limited %d, want 2", got)
	}
	if got := count(a, "A", "rate_limited", 0); got != 0 {
		t.Errorf("rate_limited %d with DNS_RATE_LIMIT off", got)
	}
	if n := up.Total(); n != 2 {
		t.Errorf("the upstream received %d queries, want the burst, 2", n)
	}
	clock.Advance(time.Second) // one token back
	if r := ask(t, "udp", a.addr(), query("later.example.com", dns.TypeA)); r.Rcode != dns.RcodeSuccess {
		t.Errorf("a second later: %s, want NOERROR", rcodeName(r))
	}
}

// upstream_limited starts at zero with every other outcome. The fleet's
// series are served only when the limit is shared on Redis, every label
// value from the start, and pass the linter; a local limit has no mode.
func TestOutboundSeries(t *testing.T) {
	r := startRedisProc(t)
	up := startUpstream(t)
	fleetSeries := []string{
		`dnsproxi_upstream_ratelimit_mode{mode="shared"} 1`,
		`dnsproxi_upstream_ratelimit_mode{mode="local"} 0`,
		`dnsproxi_upstream_ratelimit_redis_calls_total{result="ok"} `,
		`dnsproxi_upstream_ratelimit_redis_calls_total{result="error"} 0`,
		`dnsproxi_upstream_ratelimit_redis_calls_total{result="timeout"} 0`,
		`dnsproxi_upstream_ratelimit_fleet_instances 1`,
		`dnsproxi_upstream_ratelimit_lease_tokens `,
	}
	tests := []struct {
		name  string
		redis string
		fleet bool
	}{
		{"off", "", false},
		{"local", "", false},
		{"fleet", r.URL(), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(up.Addr())
			cfg.MetricsAddr = "127.0.0.1:0"
			if tt.name != "off" {
				cfg.UpstreamRateLimit = RateLimit{Rate: 100, Burst: 100}
				cfg.UpstreamRateLimitRedis = RedisURL(tt.redis)
				cfg.UpstreamRateLimitKey = "series"
				cfg.UpstreamRateLimitTimeout = time.Second
			}
			a := startProxy(t, cfg, guard.RealClock{})
			page := scrape(t, a)
			if !strings.Contains(page, `dnsproxi_queries_total{outcome="upstream_limited",qtype="A"} 0`) {
				t.Error("/metrics lacks upstream_limited at 0")
			}
			for _, want := range fleetSeries {
				if got := strings.Contains(page, "\n"+want); got != tt.fleet {
					t.Errorf("%s in /metrics: %v, want %v", want, got, tt.fleet)
				}
			}
			problems, err := testutil.GatherAndLint(a.metrics.Registry)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range problems {
				t.Errorf("lint: %s: %s", p.Metric, p.Text)
			}
		})
	}
}

// noTokens is an outbound limit that refuses every attempt.
type noTokens struct{}

func (noTokens) Allow(int) bool { return false }

// limitedPool is onePool behind an outbound limit that has no token.
func limitedPool(fwd forwarder) *pool.Pool {
	p, err := pool.New(pool.Config{Members: []pool.Member{{Name: "fake", Upstream: untimed{fwd}}}, Valid: validReply, Outbound: noTokens{}})
	if err != nil {
		panic(err)
	}
	return p
}
