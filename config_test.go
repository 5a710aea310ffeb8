package main

import (
	"bytes"
	"context"
	"maps"
	"os"
	"strings"
	"testing"
	"time"
)

// allVars are every variable loadConfig reads; each test starts from none set.
var allVars = []string{"DNS_LISTEN", "DNS_UPSTREAM", "DNS_UPSTREAM_TIMEOUT", "DNS_RATE_LIMIT",
	"DNS_BREAKER_THRESHOLD", "DNS_BREAKER_MIN_SAMPLES", "DNS_BREAKER_WINDOW", "DNS_BREAKER_COOLOFF", "DNS_METRICS_ADDR",
	"DNS_MAX_INFLIGHT", "DNS_TCP_MAX_CONNS", "DNS_TCP_IDLE_TIMEOUT"}

func setEnv(t *testing.T, env map[string]string) {
	t.Helper()
	for _, k := range allVars {
		t.Setenv(k, "") // restored when the test ends
		os.Unsetenv(k)
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
}

func TestLoadConfigDefaults(t *testing.T) {
	setEnv(t, map[string]string{"DNS_UPSTREAM": "127.0.0.1:5300"})
	cfg, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		Listen: "127.0.0.1:5398", Upstream: "127.0.0.1:5300", UpstreamTimeout: 2 * time.Second,
		BreakerMinSamples: 20, BreakerWindow: 100, BreakerCoolOff: 5 * time.Second, MetricsAddr: "127.0.0.1:9398",
		MaxInflight: 1000, TCPMaxConns: 1000, TCPIdleTimeout: 10 * time.Second,
	}
	if cfg != want {
		t.Fatalf("defaults\n got %+v\nwant %+v", cfg, want)
	}
	if cfg.RateLimit.On() || cfg.BreakerThreshold != 0 {
		t.Fatal("a gate is on by default")
	}
}

func TestLoadConfigGood(t *testing.T) {
	tests := []struct {
		env   map[string]string
		check func(Config) bool
	}{
		{map[string]string{"DNS_RATE_LIMIT": "5"}, func(c Config) bool { return c.RateLimit == RateLimit{5, 5} }},
		{map[string]string{"DNS_RATE_LIMIT": "5,10"}, func(c Config) bool { return c.RateLimit == RateLimit{5, 10} }},
		{map[string]string{"DNS_RATE_LIMIT": " 2.5 , 1 "}, func(c Config) bool { return c.RateLimit == RateLimit{2.5, 1} }},
		{map[string]string{"DNS_RATE_LIMIT": "0.5"}, func(c Config) bool { return c.RateLimit == RateLimit{0.5, 1} }},
		{map[string]string{"DNS_RATE_LIMIT": ""}, func(c Config) bool { return !c.RateLimit.On() }},
		{map[string]string{"DNS_BREAKER_THRESHOLD": "50"}, func(c Config) bool { return c.BreakerThreshold == 50 }},
		{map[string]string{"DNS_BREAKER_THRESHOLD": "100"}, func(c Config) bool { return c.BreakerThreshold == 100 }},
		{map[string]string{"DNS_BREAKER_MIN_SAMPLES": "5", "DNS_BREAKER_WINDOW": "10"}, func(c Config) bool {
			return c.BreakerMinSamples == 5 && c.BreakerWindow == 10
		}},
		{map[string]string{"DNS_UPSTREAM_TIMEOUT": "300ms", "DNS_BREAKER_COOLOFF": "1s"}, func(c Config) bool {
			return c.UpstreamTimeout == 300*time.Millisecond && c.BreakerCoolOff == time.Second
		}},
		{map[string]string{"DNS_METRICS_ADDR": "off"}, func(c Config) bool { return c.MetricsAddr == "off" }},
		{map[string]string{"DNS_LISTEN": "[::1]:53"}, func(c Config) bool { return c.Listen == "[::1]:53" }},
		{map[string]string{"DNS_MAX_INFLIGHT": "0"}, func(c Config) bool { return c.MaxInflight == 0 }},
		{map[string]string{"DNS_MAX_INFLIGHT": "50"}, func(c Config) bool { return c.MaxInflight == 50 }},
		{map[string]string{"DNS_TCP_MAX_CONNS": "10", "DNS_TCP_IDLE_TIMEOUT": "2s"}, func(c Config) bool {
			return c.TCPMaxConns == 10 && c.TCPIdleTimeout == 2*time.Second
		}},
		{map[string]string{"DNS_UPSTREAM": "[::1]:53"}, func(c Config) bool { return c.Upstream == "[::1]:53" }},
	}
	for _, tt := range tests {
		t.Run(envString(tt.env), func(t *testing.T) {
			setEnv(t, withUpstream(tt.env))
			cfg, err := loadConfig()
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(cfg) {
				t.Fatalf("parsed as %+v", cfg)
			}
		})
	}
}

func TestLoadConfigBad(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want string // the whole one-line error
	}{
		{map[string]string{"DNS_RATE_LIMIT": "5,x"}, `DNS_RATE_LIMIT="5,x": burst must be a positive integer`},
		{map[string]string{"DNS_RATE_LIMIT": "5,0"}, `DNS_RATE_LIMIT="5,0": burst must be a positive integer`},
		{map[string]string{"DNS_RATE_LIMIT": "0"}, `DNS_RATE_LIMIT="0": rate must be a positive number of queries per second`},
		{map[string]string{"DNS_RATE_LIMIT": "-3,2"}, `DNS_RATE_LIMIT="-3,2": rate must be a positive number of queries per second`},
		{map[string]string{"DNS_RATE_LIMIT": "fast"}, `DNS_RATE_LIMIT="fast": rate must be a positive number of queries per second`},
		{map[string]string{"DNS_RATE_LIMIT": "NaN"}, `DNS_RATE_LIMIT="NaN": rate must be a positive number of queries per second`},
		{map[string]string{"DNS_UPSTREAM_TIMEOUT": "2"}, `DNS_UPSTREAM_TIMEOUT="2": must be a duration such as 2s or 500ms`},
		{map[string]string{"DNS_UPSTREAM_TIMEOUT": "-1s"}, `DNS_UPSTREAM_TIMEOUT="-1s": must be a positive duration`},
		{map[string]string{"DNS_BREAKER_THRESHOLD": "half"}, `DNS_BREAKER_THRESHOLD="half": must be an integer`},
		{map[string]string{"DNS_BREAKER_THRESHOLD": "101"}, `DNS_BREAKER_THRESHOLD="101": must be a percentage 1..100, or 0 for off`},
		{map[string]string{"DNS_BREAKER_THRESHOLD": "-5"}, `DNS_BREAKER_THRESHOLD="-5": must be a percentage 1..100, or 0 for off`},
		{map[string]string{"DNS_BREAKER_WINDOW": "0"}, `DNS_BREAKER_WINDOW="0": must be a positive integer`},
		{map[string]string{"DNS_BREAKER_MIN_SAMPLES": "200"}, `DNS_BREAKER_MIN_SAMPLES="200": must be 1..100 (DNS_BREAKER_WINDOW)`},
		{map[string]string{"DNS_BREAKER_MIN_SAMPLES": "0"}, `DNS_BREAKER_MIN_SAMPLES="0": must be 1..100 (DNS_BREAKER_WINDOW)`},
		{map[string]string{"DNS_BREAKER_COOLOFF": "1s"}, `DNS_BREAKER_COOLOFF="1s": must exceed DNS_UPSTREAM_TIMEOUT (2s)`},
		{map[string]string{"DNS_BREAKER_COOLOFF": "soon"}, `DNS_BREAKER_COOLOFF="soon": must be a duration such as 2s or 500ms`},
		{map[string]string{"DNS_LISTEN": "localhost:53"}, `DNS_LISTEN="localhost:53": must be an IP address and port such as 127.0.0.1:5398`},
		{map[string]string{"DNS_LISTEN": "127.0.0.1"}, `DNS_LISTEN="127.0.0.1": must be an IP address and port such as 127.0.0.1:5398`},
		{map[string]string{"DNS_UPSTREAM": "127.0.0.1"}, `DNS_UPSTREAM="127.0.0.1": must be host:port such as 127.0.0.1:53`},
		{map[string]string{"DNS_UPSTREAM": "127.0.0.1:99999"}, `DNS_UPSTREAM="127.0.0.1:99999": must be host:port such as 127.0.0.1:53`},
		{map[string]string{"DNS_MAX_INFLIGHT": "-1"}, `DNS_MAX_INFLIGHT="-1": must be 0 (unlimited) or a positive integer`},
		{map[string]string{"DNS_MAX_INFLIGHT": "lots"}, `DNS_MAX_INFLIGHT="lots": must be an integer`},
		{map[string]string{"DNS_TCP_MAX_CONNS": "0"}, `DNS_TCP_MAX_CONNS="0": must be a positive integer`},
		{map[string]string{"DNS_TCP_IDLE_TIMEOUT": "0s"}, `DNS_TCP_IDLE_TIMEOUT="0s": must be a positive duration`},
		{map[string]string{"DNS_METRICS_ADDR": "9398"}, `DNS_METRICS_ADDR="9398": must be host:port such as 127.0.0.1:9398, or off`},
	}
	for _, tt := range tests {
		t.Run(envString(tt.env), func(t *testing.T) {
			setEnv(t, withUpstream(tt.env))
			_, err := loadConfig()
			if err == nil || err.Error() != tt.want {
				t.Fatalf("error %v\nwant    %s", err, tt.want)
			}
		})
	}
}

func TestSystemResolverDefault(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/resolv.conf"
	writeFile(t, path, "# comment\nsearch example\nnameserver 127.0.0.53\nnameserver 127.0.0.54\n")
	if got, err := systemResolver(path); err != nil || got != "127.0.0.53:53" {
		t.Fatalf("systemResolver = %q, %v; want the first nameserver on port 53", got, err)
	}
	writeFile(t, path, "search example\n")
	if _, err := systemResolver(path); err == nil {
		t.Fatal("a resolv.conf without nameserver gave no error")
	}
}

func TestRunHelpAndBadConfig(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, &out, &errOut, nil); code != 0 {
		t.Fatalf("-h exit %d", code)
	}
	for _, v := range allVars {
		if !strings.Contains(out.String(), v) {
			t.Errorf("-h does not mention %s:\n%s", v, out.String())
		}
	}
	setEnv(t, map[string]string{"DNS_UPSTREAM": "127.0.0.1:5300", "DNS_RATE_LIMIT": "5,x"})
	out.Reset()
	if code := run(context.Background(), nil, &out, &errOut, nil); code != 2 {
		t.Fatalf("bad config exit %d, want 2", code)
	}
	if got := errOut.String(); got != "dnsproxi: DNS_RATE_LIMIT=\"5,x\": burst must be a positive integer\n" {
		t.Fatalf("stderr %q, want one line naming the variable", got)
	}
}

func envString(env map[string]string) string {
	var parts []string
	for k, v := range env {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

// withUpstream is env with a loopback DNS_UPSTREAM unless env sets one:
// no test may fall back to the system resolver.
func withUpstream(env map[string]string) map[string]string {
	out := map[string]string{"DNS_UPSTREAM": "127.0.0.1:5300"}
	maps.Copy(out, env)
	return out
}
