package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"dnsproxi/pool"
)

// failoverVars are the variables of the set of upstreams; setEnv clears them too.
var failoverVars = []string{"DNS_UPSTREAM_POLICY", "DNS_RETRY_BUDGET", "DNS_UPSTREAM_HEDGE"}

func init() { allVars = append(allVars, failoverVars...) }

// loopbackList is n loopback upstreams on ports 5300, 5301, ...
func loopbackList(n int) string {
	var parts []string
	for i := range n {
		parts = append(parts, fmt.Sprintf("127.0.0.1:%d", 5300+i))
	}
	return strings.Join(parts, ",")
}

func TestConfigUpstreamList(t *testing.T) {
	tests := []goodConfig{
		{map[string]string{}, func(c Config) bool {
			return len(c.Upstreams()) == 1 && c.UpstreamPolicy == UpstreamPolicy(pool.Sequential) &&
				c.RetryBudget == 10 && c.UpstreamHedge.After == 0 // one upstream: nowhere to hedge to
		}},
		{map[string]string{"DNS_UPSTREAM": "127.0.0.1:5300,127.0.0.1:5301"}, func(c Config) bool {
			return strings.Join(c.Upstreams(), " ") == "127.0.0.1:5300 127.0.0.1:5301" &&
				c.UpstreamHedge.After == 500*time.Millisecond // a quarter of the 2s timeout
		}},
		{map[string]string{"DNS_UPSTREAM": " [::1]:53 , 127.0.0.1:5301 ,localhost:5302"}, func(c Config) bool {
			return c.Upstream == "[::1]:53,127.0.0.1:5301,127.0.0.1:5302"
		}},
		{map[string]string{"DNS_UPSTREAM": loopbackList(16)}, func(c Config) bool { return len(c.Upstreams()) == 16 }},
		{map[string]string{"DNS_UPSTREAM_POLICY": "round_robin"}, func(c Config) bool { return c.UpstreamPolicy == UpstreamPolicy(pool.RoundRobin) }},
		{map[string]string{"DNS_UPSTREAM_POLICY": "FASTEST"}, func(c Config) bool { return c.UpstreamPolicy == UpstreamPolicy(pool.Fastest) }},
		{map[string]string{"DNS_RETRY_BUDGET": "0", "DNS_UPSTREAM": loopbackList(2)}, func(c Config) bool {
			return c.RetryBudget == 0 && c.UpstreamHedge.After == 0 // no budget: no hedges either
		}},
		{map[string]string{"DNS_RETRY_BUDGET": "100"}, func(c Config) bool { return c.RetryBudget == 100 }},
		{map[string]string{"DNS_UPSTREAM_HEDGE": "off", "DNS_UPSTREAM": loopbackList(2)}, func(c Config) bool {
			return c.UpstreamHedge.After == 0 && c.UpstreamHedge.String() == "off"
		}},
		{map[string]string{"DNS_UPSTREAM_HEDGE": "100MS", "DNS_UPSTREAM": loopbackList(2)}, func(c Config) bool {
			return c.UpstreamHedge.After == 100*time.Millisecond
		}},
		{map[string]string{"DNS_UPSTREAM_HEDGE": "1.8s", "DNS_UPSTREAM": loopbackList(2)}, func(c Config) bool {
			return c.UpstreamHedge.After == 1800*time.Millisecond // nine tenths of 2s: the most
		}},
		{map[string]string{"DNS_UPSTREAM_TIMEOUT": "400ms", "DNS_UPSTREAM": loopbackList(3)}, func(c Config) bool {
			return c.UpstreamHedge.After == 100*time.Millisecond
		}},
	}
	loadsAs(t, tests)
}

// The bad values, and the other ways a list or its companions can
// be wrong: one line naming the variable, the value and what is expected.
func TestConfigUpstreamListBad(t *testing.T) {
	seventeen := loopbackList(17)
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"DNS_UPSTREAM": "127.0.0.1:5300,,127.0.0.1:5301"},
			`DNS_UPSTREAM="127.0.0.1:5300,,127.0.0.1:5301": entry 2 is empty; want host:port such as 127.0.0.1:53, port 1..65535 entries separated by commas`},
		{map[string]string{"DNS_UPSTREAM": "127.0.0.1:5300,"},
			`DNS_UPSTREAM="127.0.0.1:5300,": entry 2 is empty; want host:port such as 127.0.0.1:53, port 1..65535 entries separated by commas`},
		{map[string]string{"DNS_UPSTREAM": seventeen}, `DNS_UPSTREAM="` + seventeen + `": 17 upstreams; at most 16`},
		{map[string]string{"DNS_UPSTREAM": "127.0.0.1:5300,127.0.0.1"},
			`DNS_UPSTREAM="127.0.0.1:5300,127.0.0.1": entry 2 ("127.0.0.1") must be host:port such as 127.0.0.1:53, port 1..65535`},
		{map[string]string{"DNS_UPSTREAM": "127.0.0.1:5300,localhost:5300"},
			`DNS_UPSTREAM="127.0.0.1:5300,localhost:5300": entry 2 (127.0.0.1:5300) repeats entry 1`},
		{map[string]string{"DNS_UPSTREAM": "127.0.0.1:5300,127.0.0.1:5398"},
			`DNS_UPSTREAM="127.0.0.1:5300,127.0.0.1:5398": must not be DNS_LISTEN (127.0.0.1:5398): every query would come back to dnsproxi`},
		{map[string]string{"DNS_UPSTREAM_POLICY": "random"}, `DNS_UPSTREAM_POLICY="random": must be one of sequential, round_robin, fastest`},
		{map[string]string{"DNS_RETRY_BUDGET": "-1"}, `DNS_RETRY_BUDGET="-1": must be an integer from 0 to 100`},
		{map[string]string{"DNS_RETRY_BUDGET": "101"}, `DNS_RETRY_BUDGET="101": must be an integer from 0 to 100`},
		{map[string]string{"DNS_RETRY_BUDGET": "10%"}, `DNS_RETRY_BUDGET="10%": must be an integer from 0 to 100`},
		{map[string]string{"DNS_UPSTREAM_HEDGE": "2s", "DNS_UPSTREAM": loopbackList(2)},
			`DNS_UPSTREAM_HEDGE="2s": must be at most nine tenths of DNS_UPSTREAM_TIMEOUT (1.8s): a hedge needs a tenth of the deadline left`},
		{map[string]string{"DNS_UPSTREAM_HEDGE": "300ms", "DNS_UPSTREAM_TIMEOUT": "300ms", "DNS_UPSTREAM": loopbackList(2)},
			`DNS_UPSTREAM_HEDGE="300ms": must be at most nine tenths of DNS_UPSTREAM_TIMEOUT (270ms): a hedge needs a tenth of the deadline left`},
		{map[string]string{"DNS_UPSTREAM_HEDGE": "soon"}, `DNS_UPSTREAM_HEDGE="soon": must be a duration from 1ms to 30s, such as 500ms, or off`},
		{map[string]string{"DNS_UPSTREAM_HEDGE": "0s"}, `DNS_UPSTREAM_HEDGE="0s": must be a duration from 1ms to 30s, such as 500ms, or off`},
		{map[string]string{"DNS_UPSTREAM_HEDGE": "100ms", "DNS_RETRY_BUDGET": "0", "DNS_UPSTREAM": loopbackList(2)},
			`DNS_UPSTREAM_HEDGE="100ms": hedges spend the retry budget, and DNS_RETRY_BUDGET is 0; raise it or set the hedge off`},
	}
	for _, tt := range tests {
		t.Run(envString(tt.env), func(t *testing.T) { wantConfigError(t, tt.env, tt.want) })
	}
}

// The bad values stop run before anything is bound: exit 2 and one
// line on stderr.
func TestRunFailoverConfigErrorExit2(t *testing.T) {
	seventeen := loopbackList(17)
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"DNS_UPSTREAM": "127.0.0.1:5300,,127.0.0.1:5301"},
			`DNS_UPSTREAM="127.0.0.1:5300,,127.0.0.1:5301": entry 2 is empty; want host:port such as 127.0.0.1:53, port 1..65535 entries separated by commas`},
		{map[string]string{"DNS_UPSTREAM": seventeen}, `DNS_UPSTREAM="` + seventeen + `": 17 upstreams; at most 16`},
		{map[string]string{"DNS_UPSTREAM_POLICY": "random"}, `DNS_UPSTREAM_POLICY="random": must be one of sequential, round_robin, fastest`},
		{map[string]string{"DNS_RETRY_BUDGET": "-5"}, `DNS_RETRY_BUDGET="-5": must be an integer from 0 to 100`},
		{map[string]string{"DNS_UPSTREAM": loopbackList(2), "DNS_UPSTREAM_HEDGE": "5s"},
			`DNS_UPSTREAM_HEDGE="5s": must be at most nine tenths of DNS_UPSTREAM_TIMEOUT (1.8s): a hedge needs a tenth of the deadline left`},
	}
	for _, tt := range tests {
		t.Run(envString(tt.env), func(t *testing.T) {
			exitsTwo(t, tt.env, tt.want)
		})
	}
}
