package main

import (
	"bytes"
	"context"
	"maps"
	"net"
	"net/netip"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"dnsproxi/guard"
)

// allVars are every variable loadConfig reads; each test starts from none set.
var allVars = []string{"DNS_LISTEN", "DNS_UPSTREAM", "DNS_UPSTREAM_TIMEOUT", "DNS_RATE_LIMIT",
	"DNS_BREAKER_THRESHOLD", "DNS_BREAKER_MIN_SAMPLES", "DNS_BREAKER_WINDOW", "DNS_BREAKER_COOLOFF", "DNS_METRICS_ADDR",
	"DNS_MAX_INFLIGHT", "DNS_TCP_MAX_CONNS", "DNS_TCP_IDLE_TIMEOUT", "DNS_MAX_UDP_SIZE", "DNS_UPSTREAM_0X20",
	"DNS_ALLOW", "DNS_CLIENT_RATE_LIMIT", "DNS_CLIENT_PREFIX", "DNS_CLIENT_TABLE_SIZE", "DNS_CLIENT_EXEMPT", "DNS_LIMIT_ACTION",
	"DNS_QUERY_LOG", "DNS_QUERY_LOG_SAMPLE",
	"DNS_CACHE_SIZE", "DNS_CACHE_MIN_TTL", "DNS_CACHE_MAX_TTL", "DNS_CACHE_MAX_NEGATIVE_TTL", "DNS_CACHE_STALE",
	"DNS_CACHE_STALE_WAIT", "DNS_CACHE_PREFETCH"}

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
		Listen: "127.0.0.1:5398", Upstream: "127.0.0.1:5300", UpstreamTimeout: 2 * time.Second, RetryBudget: 10,
		BreakerMinSamples: 20, BreakerWindow: 100, BreakerCoolOff: 5 * time.Second, MetricsAddr: "127.0.0.1:9398",
		MaxInflight: 1000, TCPMaxConns: 1000, TCPIdleTimeout: 10 * time.Second, MaxUDPSize: 1232, Upstream0x20: true,
		QueryLogSample: 1,
	}
	want.Allow.Prefixes = guard.DefaultAccessPrefixes()
	want.ClientPrefix, want.ClientTableSize = ClientPrefix{32, 64}, 100000
	want.CacheMaxTTL, want.CacheMaxNegativeTTL, want.CacheStaleWait = 24*time.Hour, time.Hour, 1800*time.Millisecond
	want.UpstreamRateLimitKey, want.UpstreamRateLimitTimeout = "dnsproxi", 50*time.Millisecond
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("defaults\n got %+v\nwant %+v", cfg, want)
	}
	if cfg.RateLimit.On() || cfg.BreakerThreshold != 0 {
		t.Fatal("a gate is on by default")
	}
}

func TestLoadConfigGood(t *testing.T) {
	tests := []goodConfig{
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
		// every bound is inclusive
		{map[string]string{"DNS_RATE_LIMIT": "0.001"}, func(c Config) bool { return c.RateLimit == RateLimit{0.001, 1} }},
		{map[string]string{"DNS_RATE_LIMIT": "1e8"}, func(c Config) bool { return c.RateLimit == RateLimit{1e8, 1e8} }},
		{map[string]string{"DNS_RATE_LIMIT": "1,100000000"}, func(c Config) bool { return c.RateLimit == RateLimit{1, 1e8} }},
		{map[string]string{"DNS_BREAKER_THRESHOLD": "50", "DNS_BREAKER_WINDOW": "100000", "DNS_BREAKER_MIN_SAMPLES": "100000"}, func(c Config) bool {
			return c.BreakerWindow == 100000 && c.BreakerMinSamples == 100000
		}},
		{map[string]string{"DNS_MAX_INFLIGHT": "100000", "DNS_TCP_MAX_CONNS": "100000"}, func(c Config) bool {
			return c.MaxInflight == 100000 && c.TCPMaxConns == 100000
		}},
		{map[string]string{"DNS_UPSTREAM_TIMEOUT": "10ms", "DNS_TCP_IDLE_TIMEOUT": "1s", "DNS_BREAKER_COOLOFF": "10ms"}, func(c Config) bool {
			return c.UpstreamTimeout == 10*time.Millisecond && c.TCPIdleTimeout == time.Second && c.BreakerCoolOff == 10*time.Millisecond
		}},
		{map[string]string{"DNS_UPSTREAM_TIMEOUT": "30s", "DNS_TCP_IDLE_TIMEOUT": "1h", "DNS_BREAKER_COOLOFF": "1h", "DNS_BREAKER_THRESHOLD": "100"}, func(c Config) bool {
			return c.UpstreamTimeout == 30*time.Second && c.TCPIdleTimeout == time.Hour && c.BreakerCoolOff == time.Hour
		}},
	}
	loadsAs(t, tests)
}

func TestLoadConfigBad(t *testing.T) {
	const (
		rate     = "rate must be a number of queries per second from 0.001 to 100000000, or off"
		burst    = "burst must be an integer from 1 to 100000000"
		timeout  = "must be a duration from 10ms to 30s, such as 500ms or 2s"
		coolOff  = "must be a duration from 10ms to 1h, such as 500ms or 2s"
		idle     = "must be a duration from 1s to 1h, such as 500ms or 2s"
		listen   = "must be host:port such as 127.0.0.1:5398, port 0..65535 (0: any free port)"
		upstream = "must be host:port such as 127.0.0.1:53, port 1..65535"
		metrics  = "must be host:port such as 127.0.0.1:9398, port 0..65535 (0: any free port), or off"
	)
	tests := []struct {
		env  map[string]string
		want string // the whole one-line error
	}{
		{map[string]string{"DNS_RATE_LIMIT": "5,x"}, `DNS_RATE_LIMIT="5,x": ` + burst},
		{map[string]string{"DNS_RATE_LIMIT": "5,0"}, `DNS_RATE_LIMIT="5,0": ` + burst},
		{map[string]string{"DNS_RATE_LIMIT": "0"}, `DNS_RATE_LIMIT="0": ` + rate},
		{map[string]string{"DNS_RATE_LIMIT": "-3,2"}, `DNS_RATE_LIMIT="-3,2": ` + rate},
		{map[string]string{"DNS_RATE_LIMIT": "fast"}, `DNS_RATE_LIMIT="fast": ` + rate},
		{map[string]string{"DNS_RATE_LIMIT": "NaN"}, `DNS_RATE_LIMIT="NaN": ` + rate},
		{map[string]string{"DNS_UPSTREAM_TIMEOUT": "2"}, `DNS_UPSTREAM_TIMEOUT="2": ` + timeout},
		{map[string]string{"DNS_UPSTREAM_TIMEOUT": "-1s"}, `DNS_UPSTREAM_TIMEOUT="-1s": ` + timeout},
		{map[string]string{"DNS_BREAKER_THRESHOLD": "half"}, `DNS_BREAKER_THRESHOLD="half": must be an integer from 0 to 100`},
		{map[string]string{"DNS_BREAKER_THRESHOLD": "101"}, `DNS_BREAKER_THRESHOLD="101": must be an integer from 0 to 100`},
		{map[string]string{"DNS_BREAKER_THRESHOLD": "-5"}, `DNS_BREAKER_THRESHOLD="-5": must be an integer from 0 to 100`},
		{map[string]string{"DNS_BREAKER_WINDOW": "0"}, `DNS_BREAKER_WINDOW="0": must be an integer from 1 to 100000`},
		{map[string]string{"DNS_BREAKER_MIN_SAMPLES": "0"}, `DNS_BREAKER_MIN_SAMPLES="0": must be an integer from 1 to 100000`},
		{map[string]string{"DNS_BREAKER_COOLOFF": "soon"}, `DNS_BREAKER_COOLOFF="soon": ` + coolOff},
		{map[string]string{"DNS_LISTEN": "127.0.0.1"}, `DNS_LISTEN="127.0.0.1": ` + listen},
		{map[string]string{"DNS_UPSTREAM": "127.0.0.1"}, `DNS_UPSTREAM="127.0.0.1": ` + upstream},
		{map[string]string{"DNS_UPSTREAM": "127.0.0.1:99999"}, `DNS_UPSTREAM="127.0.0.1:99999": ` + upstream},
		{map[string]string{"DNS_MAX_INFLIGHT": "-1"}, `DNS_MAX_INFLIGHT="-1": must be an integer from 0 to 100000`},
		{map[string]string{"DNS_MAX_INFLIGHT": "lots"}, `DNS_MAX_INFLIGHT="lots": must be an integer from 0 to 100000`},
		{map[string]string{"DNS_TCP_MAX_CONNS": "0"}, `DNS_TCP_MAX_CONNS="0": must be an integer from 1 to 100000`},
		{map[string]string{"DNS_TCP_IDLE_TIMEOUT": "0s"}, `DNS_TCP_IDLE_TIMEOUT="0s": ` + idle},
		{map[string]string{"DNS_METRICS_ADDR": "9398"}, `DNS_METRICS_ADDR="9398": ` + metrics},
		{map[string]string{"DNS_METRICS_ADDR": "offf"}, `DNS_METRICS_ADDR="offf": ` + metrics},
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
	for _, v := range append(allVars, "unset, empty or only spaces   its default applies") {
		if !strings.Contains(out.String(), v) {
			t.Errorf("-h does not mention %s:\n%s", v, out.String())
		}
	}
	setEnv(t, map[string]string{"DNS_UPSTREAM": "127.0.0.1:5300", "DNS_RATE_LIMIT": "5,x"})
	out.Reset()
	if code := run(context.Background(), nil, &out, &errOut, nil); code != 2 {
		t.Fatalf("bad config exit %d, want 2", code)
	}
	if got := errOut.String(); got != "dnsproxi: DNS_RATE_LIMIT=\"5,x\": burst must be an integer from 1 to 100000000\n" {
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

// wantConfigError checks that env (with a loopback DNS_UPSTREAM unless env
// sets one) is refused with exactly the one-line error want.
func wantConfigError(t *testing.T, env map[string]string, want string) {
	t.Helper()
	setEnv(t, withUpstream(env))
	cfg, err := loadConfig()
	if err == nil {
		t.Fatalf("accepted as %+v\nwant error %s", cfg, want)
	}
	if err.Error() != want {
		t.Fatalf("error %s\nwant  %s", err, want)
	}
}

// Every size is bounded: a huge window, sample count, cap or rate is a
// configuration error, not a panic or an out-of-memory death later.
func TestConfigBoundsEverySize(t *testing.T) {
	const huge = "9000000000000000000"
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"DNS_BREAKER_WINDOW": huge}, `DNS_BREAKER_WINDOW="` + huge + `": must be an integer from 1 to 100000`},
		{map[string]string{"DNS_BREAKER_WINDOW": "1000000000000", "DNS_BREAKER_THRESHOLD": "50"}, `DNS_BREAKER_WINDOW="1000000000000": must be an integer from 1 to 100000`},
		{map[string]string{"DNS_BREAKER_WINDOW": "100001"}, `DNS_BREAKER_WINDOW="100001": must be an integer from 1 to 100000`},
		{map[string]string{"DNS_BREAKER_WINDOW": "9e18"}, `DNS_BREAKER_WINDOW="9e18": must be an integer from 1 to 100000`},
		{map[string]string{"DNS_BREAKER_MIN_SAMPLES": huge, "DNS_BREAKER_WINDOW": huge}, `DNS_BREAKER_MIN_SAMPLES="` + huge + `": must be an integer from 1 to 100000`},
		{map[string]string{"DNS_MAX_INFLIGHT": "9223372036854775807"}, `DNS_MAX_INFLIGHT="9223372036854775807": must be an integer from 0 to 100000`},
		{map[string]string{"DNS_MAX_INFLIGHT": "100001"}, `DNS_MAX_INFLIGHT="100001": must be an integer from 0 to 100000`},
		{map[string]string{"DNS_TCP_MAX_CONNS": "9223372036854775807"}, `DNS_TCP_MAX_CONNS="9223372036854775807": must be an integer from 1 to 100000`},
		{map[string]string{"DNS_RATE_LIMIT": "1e300"}, `DNS_RATE_LIMIT="1e300": rate must be a number of queries per second from 0.001 to 100000000, or off`},
		{map[string]string{"DNS_RATE_LIMIT": "100000001"}, `DNS_RATE_LIMIT="100000001": rate must be a number of queries per second from 0.001 to 100000000, or off`},
		{map[string]string{"DNS_RATE_LIMIT": "1e-9"}, `DNS_RATE_LIMIT="1e-9": rate must be a number of queries per second from 0.001 to 100000000, or off`},
		{map[string]string{"DNS_RATE_LIMIT": "Inf"}, `DNS_RATE_LIMIT="Inf": rate must be a number of queries per second from 0.001 to 100000000, or off`},
		{map[string]string{"DNS_RATE_LIMIT": "5,1000000000"}, `DNS_RATE_LIMIT="5,1000000000": burst must be an integer from 1 to 100000000`},
		{map[string]string{"DNS_MAX_UDP_SIZE": "511"}, `DNS_MAX_UDP_SIZE="511": must be an integer from 512 to 4096`},
		{map[string]string{"DNS_MAX_UDP_SIZE": "4097"}, `DNS_MAX_UDP_SIZE="4097": must be an integer from 512 to 4096`},
		{map[string]string{"DNS_MAX_UDP_SIZE": "big"}, `DNS_MAX_UDP_SIZE="big": must be an integer from 512 to 4096`},
	}
	for _, tt := range tests {
		t.Run(envString(tt.env), func(t *testing.T) { wantConfigError(t, tt.env, tt.want) })
	}
}

// A duration that would make every query fail (1ns) or hang a client for an
// hour is refused with its range.
func TestConfigDurationBounds(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"DNS_UPSTREAM_TIMEOUT": "1ns"}, `DNS_UPSTREAM_TIMEOUT="1ns": must be a duration from 10ms to 30s, such as 500ms or 2s`},
		{map[string]string{"DNS_UPSTREAM_TIMEOUT": "31s"}, `DNS_UPSTREAM_TIMEOUT="31s": must be a duration from 10ms to 30s, such as 500ms or 2s`},
		{map[string]string{"DNS_UPSTREAM_TIMEOUT": "2"}, `DNS_UPSTREAM_TIMEOUT="2": must be a duration from 10ms to 30s, such as 500ms or 2s`},
		{map[string]string{"DNS_TCP_IDLE_TIMEOUT": "1ns"}, `DNS_TCP_IDLE_TIMEOUT="1ns": must be a duration from 1s to 1h, such as 500ms or 2s`},
		{map[string]string{"DNS_TCP_IDLE_TIMEOUT": "2h"}, `DNS_TCP_IDLE_TIMEOUT="2h": must be a duration from 1s to 1h, such as 500ms or 2s`},
		{map[string]string{"DNS_BREAKER_COOLOFF": "2h"}, `DNS_BREAKER_COOLOFF="2h": must be a duration from 10ms to 1h, such as 500ms or 2s`},
	}
	for _, tt := range tests {
		t.Run(envString(tt.env), func(t *testing.T) { wantConfigError(t, tt.env, tt.want) })
	}
}

// The breaker's rules bind only when the breaker is on, and a rule broken by
// a default blames the variable the operator set.
func TestConfigBreakerRulesOnlyWhenOn(t *testing.T) {
	t.Run("off", func(t *testing.T) {
		setEnv(t, withUpstream(map[string]string{"DNS_UPSTREAM_TIMEOUT": "6s", "DNS_BREAKER_WINDOW": "10", "DNS_BREAKER_MIN_SAMPLES": "50"}))
		if cfg, err := loadConfig(); err != nil || cfg.UpstreamTimeout != 6*time.Second {
			t.Fatalf("loadConfig = %+v, %v; the breaker is off, its rules do not apply", cfg, err)
		}
	})
	t.Run("window alone", func(t *testing.T) {
		setEnv(t, withUpstream(map[string]string{"DNS_BREAKER_THRESHOLD": "50", "DNS_BREAKER_WINDOW": "10"}))
		if cfg, err := loadConfig(); err != nil || cfg.BreakerMinSamples != 10 {
			t.Fatalf("loadConfig = %+v, %v; unset min samples follow a smaller window", cfg, err)
		}
	})
	bad := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"DNS_BREAKER_THRESHOLD": "50", "DNS_UPSTREAM_TIMEOUT": "6s"},
			`DNS_UPSTREAM_TIMEOUT="6s": must be shorter than DNS_BREAKER_COOLOFF (5s, its default) while the breaker is on`},
		{map[string]string{"DNS_BREAKER_THRESHOLD": "50", "DNS_BREAKER_COOLOFF": "1s"},
			`DNS_BREAKER_COOLOFF="1s": must exceed DNS_UPSTREAM_TIMEOUT (2s) while the breaker is on`},
		{map[string]string{"DNS_BREAKER_THRESHOLD": "50", "DNS_BREAKER_COOLOFF": "6s", "DNS_UPSTREAM_TIMEOUT": "6s"},
			`DNS_BREAKER_COOLOFF="6s": must exceed DNS_UPSTREAM_TIMEOUT (6s) while the breaker is on`},
		{map[string]string{"DNS_BREAKER_THRESHOLD": "50", "DNS_BREAKER_MIN_SAMPLES": "200"},
			`DNS_BREAKER_MIN_SAMPLES="200": must not exceed DNS_BREAKER_WINDOW (100) while the breaker is on`},
		{map[string]string{"DNS_BREAKER_THRESHOLD": "50", "DNS_BREAKER_MIN_SAMPLES": "11", "DNS_BREAKER_WINDOW": "10"},
			`DNS_BREAKER_MIN_SAMPLES="11": must not exceed DNS_BREAKER_WINDOW (10) while the breaker is on`},
	}
	for _, tt := range bad {
		t.Run(envString(tt.env), func(t *testing.T) { wantConfigError(t, tt.env, tt.want) })
	}
}

// Keywords and units ignore case; values ignore surrounding spaces.
func TestConfigKeywordsIgnoreCase(t *testing.T) {
	tests := []goodConfig{
		{map[string]string{"DNS_METRICS_ADDR": "OFF"}, func(c Config) bool { return c.MetricsAddr == "off" }},
		{map[string]string{"DNS_METRICS_ADDR": " Off "}, func(c Config) bool { return c.MetricsAddr == "off" }},
		{map[string]string{"DNS_RATE_LIMIT": "off"}, func(c Config) bool { return !c.RateLimit.On() }},
		{map[string]string{"DNS_RATE_LIMIT": "OFF"}, func(c Config) bool { return !c.RateLimit.On() }},
		{map[string]string{"DNS_UPSTREAM_TIMEOUT": "2S"}, func(c Config) bool { return c.UpstreamTimeout == 2*time.Second }},
		{map[string]string{"DNS_TCP_IDLE_TIMEOUT": "1M"}, func(c Config) bool { return c.TCPIdleTimeout == time.Minute }},
		{map[string]string{"DNS_BREAKER_THRESHOLD": " 50 "}, func(c Config) bool { return c.BreakerThreshold == 50 }},
	}
	loadsAs(t, tests)
}

// An empty value, or one of spaces only, is the same as an unset one: the
// default applies, for every variable.
func TestConfigEmptyMeansDefault(t *testing.T) {
	setEnv(t, withUpstream(nil))
	want, err := loadConfig()
	if err != nil {
		t.Fatal(err)
	}
	for _, blank := range []string{"", "  "} {
		t.Run(strconv.Quote(blank), func(t *testing.T) {
			env := map[string]string{}
			for _, k := range allVars {
				if k != "DNS_UPSTREAM" { // empty means resolv.conf; no test reads it
					env[k] = blank
				}
			}
			setEnv(t, withUpstream(env))
			got, err := loadConfig()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("all empty\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

// The two new variables: the UDP size cap and the 0x20 switch, whose words
// are one rule for every on/off variable.
func TestConfigUDPSizeAnd0x20(t *testing.T) {
	good := []struct {
		env   map[string]string
		check func(Config) bool
	}{
		{map[string]string{"DNS_MAX_UDP_SIZE": "512"}, func(c Config) bool { return c.MaxUDPSize == 512 }},
		{map[string]string{"DNS_MAX_UDP_SIZE": "4096"}, func(c Config) bool { return c.MaxUDPSize == 4096 }},
		{map[string]string{"DNS_UPSTREAM_0X20": "off"}, func(c Config) bool { return !c.Upstream0x20 }},
		{map[string]string{"DNS_UPSTREAM_0X20": "OFF"}, func(c Config) bool { return !c.Upstream0x20 }},
		{map[string]string{"DNS_UPSTREAM_0X20": "False"}, func(c Config) bool { return !c.Upstream0x20 }},
		{map[string]string{"DNS_UPSTREAM_0X20": "0"}, func(c Config) bool { return !c.Upstream0x20 }},
		{map[string]string{"DNS_UPSTREAM_0X20": "On"}, func(c Config) bool { return c.Upstream0x20 }},
		{map[string]string{"DNS_UPSTREAM_0X20": "TRUE"}, func(c Config) bool { return c.Upstream0x20 }},
		{map[string]string{"DNS_UPSTREAM_0X20": "1"}, func(c Config) bool { return c.Upstream0x20 }},
	}
	for _, tt := range good {
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
	for _, v := range []string{"maybe", "yes", "2", "o n"} {
		t.Run(v, func(t *testing.T) {
			wantConfigError(t, map[string]string{"DNS_UPSTREAM_0X20": v}, `DNS_UPSTREAM_0X20="`+v+`": must be on or off (also true/false, 1/0)`)
		})
	}
}

// The variables of who may ask and how much: the access list, the
// per-client bucket and what a refused query gets.
func TestConfigAccessAndClients(t *testing.T) {
	prefixes := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	good := []struct {
		env   map[string]string
		check func(Config) bool
	}{
		{nil, func(c Config) bool {
			return !c.Allow.Any && reflect.DeepEqual(c.Allow.Prefixes, guard.DefaultAccessPrefixes()) &&
				!c.ClientRateLimit.On() && c.ClientPrefix == ClientPrefix{32, 64} && c.ClientTableSize == 100000 &&
				len(c.ClientExempt) == 0 && c.LimitAction == LimitAction{}
		}},
		{map[string]string{"DNS_ALLOW": "any"}, func(c Config) bool { return c.Allow.Any }},
		{map[string]string{"DNS_ALLOW": " Any "}, func(c Config) bool { return c.Allow.Any }},
		{map[string]string{"DNS_ALLOW": "192.0.2.0/24, 2001:db8::/32"}, func(c Config) bool {
			return reflect.DeepEqual(c.Allow.Prefixes, prefixes("192.0.2.0/24", "2001:db8::/32"))
		}},
		{map[string]string{"DNS_ALLOW": "192.0.2.7"}, func(c Config) bool { return reflect.DeepEqual(c.Allow.Prefixes, prefixes("192.0.2.7/32")) }},
		{map[string]string{"DNS_ALLOW": "local,198.51.100.0/24"}, func(c Config) bool {
			return reflect.DeepEqual(c.Allow.Prefixes, append(guard.DefaultAccessPrefixes(), prefixes("198.51.100.0/24")...))
		}},
		{map[string]string{"DNS_CLIENT_RATE_LIMIT": "20"}, func(c Config) bool { return c.ClientRateLimit == RateLimit{20, 20} }},
		{map[string]string{"DNS_CLIENT_RATE_LIMIT": "20,40"}, func(c Config) bool { return c.ClientRateLimit == RateLimit{20, 40} }},
		{map[string]string{"DNS_CLIENT_PREFIX": "24,56"}, func(c Config) bool { return c.ClientPrefix == ClientPrefix{24, 56} }},
		{map[string]string{"DNS_CLIENT_PREFIX": "0,128"}, func(c Config) bool { return c.ClientPrefix == ClientPrefix{0, 128} }},
		{map[string]string{"DNS_CLIENT_PREFIX": " 32 , 0 "}, func(c Config) bool { return c.ClientPrefix == ClientPrefix{32, 0} }},
		{map[string]string{"DNS_CLIENT_TABLE_SIZE": "8"}, func(c Config) bool { return c.ClientTableSize == 8 }},
		{map[string]string{"DNS_CLIENT_TABLE_SIZE": "10000000"}, func(c Config) bool { return c.ClientTableSize == 10000000 }},
		{map[string]string{"DNS_CLIENT_EXEMPT": "10.0.0.1, fd00::/8"}, func(c Config) bool {
			return reflect.DeepEqual([]netip.Prefix(c.ClientExempt), prefixes("10.0.0.1/32", "fd00::/8"))
		}},
		{map[string]string{"DNS_LIMIT_ACTION": "drop"}, func(c Config) bool { return c.LimitAction == LimitAction{Kind: ActionDrop} }},
		{map[string]string{"DNS_LIMIT_ACTION": "Refuse"}, func(c Config) bool { return c.LimitAction == LimitAction{Kind: ActionRefuse} }},
		{map[string]string{"DNS_LIMIT_ACTION": "slip"}, func(c Config) bool { return c.LimitAction == LimitAction{ActionSlip, 2} }},
		{map[string]string{"DNS_LIMIT_ACTION": "SLIP:1"}, func(c Config) bool { return c.LimitAction == LimitAction{ActionSlip, 1} }},
		{map[string]string{"DNS_LIMIT_ACTION": "slip: 10"}, func(c Config) bool { return c.LimitAction == LimitAction{ActionSlip, 10} }},
	}
	for _, tt := range good {
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
	const (
		cidrs  = "must be any, or a comma-separated list of CIDR prefixes or addresses (such as 192.0.2.0/24, 2001:db8::/32), local for the default networks"
		exempt = "must be a comma-separated list of CIDR prefixes or addresses, such as 192.0.2.0/24, 2001:db8::/32"
		prefix = "must be v4len,v6len: an IPv4 prefix length 0..32 and an IPv6 one 0..128, such as 32,64"
		action = "must be drop, refuse, slip or slip:N with N from 1 to 10"
	)
	bad := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"DNS_ALLOW": "10.0.0.0/33"}, `DNS_ALLOW="10.0.0.0/33": ` + cidrs},
		{map[string]string{"DNS_ALLOW": "10.0.0/8"}, `DNS_ALLOW="10.0.0/8": ` + cidrs},
		{map[string]string{"DNS_ALLOW": "10.0.0.0/8,"}, `DNS_ALLOW="10.0.0.0/8,": ` + cidrs},
		{map[string]string{"DNS_ALLOW": "any,10.0.0.0/8"}, `DNS_ALLOW="any,10.0.0.0/8": ` + cidrs},
		{map[string]string{"DNS_ALLOW": "fe80::1%eth0"}, `DNS_ALLOW="fe80::1%eth0": ` + cidrs},
		{map[string]string{"DNS_CLIENT_EXEMPT": "nobody"}, `DNS_CLIENT_EXEMPT="nobody": ` + exempt},
		{map[string]string{"DNS_CLIENT_EXEMPT": "any"}, `DNS_CLIENT_EXEMPT="any": ` + exempt},
		{map[string]string{"DNS_CLIENT_PREFIX": "33,64"}, `DNS_CLIENT_PREFIX="33,64": ` + prefix},
		{map[string]string{"DNS_CLIENT_PREFIX": "24,129"}, `DNS_CLIENT_PREFIX="24,129": ` + prefix},
		{map[string]string{"DNS_CLIENT_PREFIX": "24"}, `DNS_CLIENT_PREFIX="24": ` + prefix},
		{map[string]string{"DNS_CLIENT_PREFIX": "-1,64"}, `DNS_CLIENT_PREFIX="-1,64": ` + prefix},
		{map[string]string{"DNS_CLIENT_TABLE_SIZE": "7"}, `DNS_CLIENT_TABLE_SIZE="7": must be an integer from 8 to 10000000`},
		{map[string]string{"DNS_CLIENT_TABLE_SIZE": "10000001"}, `DNS_CLIENT_TABLE_SIZE="10000001": must be an integer from 8 to 10000000`},
		{map[string]string{"DNS_CLIENT_RATE_LIMIT": "0"}, `DNS_CLIENT_RATE_LIMIT="0": rate must be a number of queries per second from 0.001 to 100000000, or off`},
		{map[string]string{"DNS_CLIENT_RATE_LIMIT": "0.001,100000000"}, `DNS_CLIENT_RATE_LIMIT="0.001,100000000": a bucket must refill within 100 years: burst/rate is 1e+11 s`},
		{map[string]string{"DNS_LIMIT_ACTION": "slip:0"}, `DNS_LIMIT_ACTION="slip:0": ` + action},
		{map[string]string{"DNS_LIMIT_ACTION": "slip:11"}, `DNS_LIMIT_ACTION="slip:11": ` + action},
		{map[string]string{"DNS_LIMIT_ACTION": "slip:x"}, `DNS_LIMIT_ACTION="slip:x": ` + action},
		{map[string]string{"DNS_LIMIT_ACTION": "servfail"}, `DNS_LIMIT_ACTION="servfail": ` + action},
		{map[string]string{"DNS_LIMIT_ACTION": "drop:2"}, `DNS_LIMIT_ACTION="drop:2": ` + action},
	}
	for _, tt := range bad {
		t.Run(envString(tt.env), func(t *testing.T) { wantConfigError(t, tt.env, tt.want) })
	}
}

// goodConfig is an environment that must load, and what it must load as.
type goodConfig struct {
	env   map[string]string
	check func(Config) bool
}

// loadsAs loads each case's environment (with an upstream set): it must
// load without error and pass its check. It reads the environment as
// loadConfig does, without the check against this process's file
// descriptor limit, which is the machine's (TestCheckDescriptors).
func loadsAs(t *testing.T, tests []goodConfig) {
	t.Helper()
	for _, tt := range tests {
		t.Run(envString(tt.env), func(t *testing.T) {
			setEnv(t, withUpstream(tt.env))
			cfg, err := readConfig(os.LookupEnv, net.DefaultResolver)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(cfg) {
				t.Fatalf("loaded as %+v", cfg)
			}
		})
	}
}
