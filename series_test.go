package main

import (
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"dnsproxi/guard"
)

// scrape returns a's /metrics page.
func scrape(t *testing.T, a *app) string {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(a.metricsURL())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// With the breaker off there is no breaker to report on: its series are
// left out, so that an off breaker never reads as a closed one. With it on,
// both are there from the start.
func TestBreakerSeriesOnlyWithBreaker(t *testing.T) {
	tests := []struct {
		name      string
		threshold int
		want      bool
	}{
		{"off", 0, false},
		{"on", 50, true},
	}
	up := startUpstream(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(up.Addr())
			cfg.MetricsAddr = "127.0.0.1:0"
			cfg.BreakerThreshold = tt.threshold
			page := scrape(t, startProxy(t, cfg, guard.RealClock{}))
			for _, name := range []string{"dnsproxi_breaker_state", "dnsproxi_breaker_transitions_total"} {
				if got := strings.Contains(page, "\n"+name); got != tt.want {
					t.Errorf("breaker %s: %s in /metrics = %v, want %v", tt.name, name, got, tt.want)
				}
			}
		})
	}
}

// The in-flight cap is served beside the gauge it caps, so an alert can say
// "near the cap" without copying DNS_MAX_INFLIGHT into its rule; 0 is no cap.
func TestInFlightLimitSeries(t *testing.T) {
	up := startUpstream(t)
	for _, limit := range []int{1000, 0} {
		cfg := testConfig(up.Addr())
		cfg.MetricsAddr = "127.0.0.1:0"
		cfg.MaxInflight = limit
		want := "\ndnsproxi_queries_in_flight_limit " + strconv.Itoa(limit) + "\n"
		if page := scrape(t, startProxy(t, cfg, guard.RealClock{})); !strings.Contains(page, want) {
			t.Errorf("DNS_MAX_INFLIGHT=%d: /metrics lacks %q", limit, want[1:len(want)-1])
		}
	}
}
