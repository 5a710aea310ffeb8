package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"
)

// outboundVars are the outbound limit's variables; setEnv clears them too.
var outboundVars = []string{"DNS_UPSTREAM_RATE_LIMIT", "DNS_UPSTREAM_RATE_LIMIT_REDIS", "DNS_UPSTREAM_RATE_LIMIT_KEY",
	"DNS_UPSTREAM_RATE_LIMIT_REDIS_TIMEOUT", "DNS_UPSTREAM_RATE_LIMIT_FALLBACK"}

func init() { allVars = append(allVars, outboundVars...) }

// The outbound limit's variables, off by default, each under the one rule
// for values; the URL is never shown with its password.
func TestConfigOutbound(t *testing.T) {
	tests := []struct {
		env   map[string]string
		check func(Config) bool
	}{
		{map[string]string{}, func(c Config) bool {
			return !c.UpstreamRateLimit.On() && c.UpstreamRateLimitRedis == "" && c.UpstreamRateLimitKey == "dnsproxi" &&
				c.UpstreamRateLimitTimeout == 50*time.Millisecond && c.UpstreamRateLimitFallback == 0 && outboundSummary(c) == "off"
		}},
		{map[string]string{"DNS_UPSTREAM_RATE_LIMIT": "3000"}, func(c Config) bool {
			return c.UpstreamRateLimit == RateLimit{Rate: 3000, Burst: 3000} && outboundSummary(c) == "3000,3000 (this instance)"
		}},
		{map[string]string{"DNS_UPSTREAM_RATE_LIMIT": "3000,300", "DNS_UPSTREAM_RATE_LIMIT_REDIS": " rediss://u:s3cret@redis.internal:6380/2 ",
			"DNS_UPSTREAM_RATE_LIMIT_KEY": "edge", "DNS_UPSTREAM_RATE_LIMIT_REDIS_TIMEOUT": "20ms", "DNS_UPSTREAM_RATE_LIMIT_FALLBACK": "1000"}, func(c Config) bool {
			s := outboundSummary(c)
			return c.UpstreamRateLimitRedis == "rediss://u:s3cret@redis.internal:6380/2" && c.UpstreamRateLimitKey == "edge" &&
				c.UpstreamRateLimitTimeout == 20*time.Millisecond && c.UpstreamRateLimitFallback == 1000 &&
				s == "3000,300 for the fleet on rediss://u:xxxxx@redis.internal:6380/2 key edge, timeout 20ms, fallback 1000"
		}},
		{map[string]string{"DNS_UPSTREAM_RATE_LIMIT": "off", "DNS_UPSTREAM_RATE_LIMIT_REDIS": "  "}, func(c Config) bool {
			return !c.UpstreamRateLimit.On() && c.UpstreamRateLimitRedis == ""
		}},
	}
	for _, tt := range tests {
		t.Run(envString(tt.env), func(t *testing.T) {
			setEnv(t, withUpstream(tt.env))
			cfg, err := loadConfig()
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(cfg) {
				t.Fatalf("parsed as %+v; summary %q", cfg, outboundSummary(cfg))
			}
		})
	}
	if h := usage(); !strings.Contains(h, "DNS_UPSTREAM_RATE_LIMIT_FALLBACK") || !regexp.MustCompile(`DNS_UPSTREAM_RATE_LIMIT_REDIS_TIMEOUT +50ms +1ms\.\.1s`).MatchString(h) {
		t.Errorf("-h does not list the outbound limit's variables:\n%s", h)
	}
}

// The fleet's variables mean nothing without DNS_UPSTREAM_RATE_LIMIT_REDIS:
// one given without it contradicts it (the operator believes the fleet is
// limited on Redis, or its fallback bounded, and neither is) and stops
// start-up with one line naming it, exit code 2. Each alone, and the first
// in the order below when several are given.
func TestConfigOutboundFleetVariablesNeedRedis(t *testing.T) {
	const needs = `: applies only to the fleet's limit on Redis, and DNS_UPSTREAM_RATE_LIMIT_REDIS is unset`
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"DNS_UPSTREAM_RATE_LIMIT": "300", "DNS_UPSTREAM_RATE_LIMIT_FALLBACK": "50"},
			`DNS_UPSTREAM_RATE_LIMIT_FALLBACK="50"` + needs},
		{map[string]string{"DNS_UPSTREAM_RATE_LIMIT_FALLBACK": " 50 "},
			`DNS_UPSTREAM_RATE_LIMIT_FALLBACK=" 50 "` + needs},
		{map[string]string{"DNS_UPSTREAM_RATE_LIMIT": "300", "DNS_UPSTREAM_RATE_LIMIT_KEY": "edge"},
			`DNS_UPSTREAM_RATE_LIMIT_KEY="edge"` + needs},
		{map[string]string{"DNS_UPSTREAM_RATE_LIMIT": "300", "DNS_UPSTREAM_RATE_LIMIT_REDIS_TIMEOUT": "20ms"},
			`DNS_UPSTREAM_RATE_LIMIT_REDIS_TIMEOUT="20ms"` + needs},
		{map[string]string{"DNS_UPSTREAM_RATE_LIMIT": "300", "DNS_UPSTREAM_RATE_LIMIT_REDIS": "  ", "DNS_UPSTREAM_RATE_LIMIT_KEY": "edge",
			"DNS_UPSTREAM_RATE_LIMIT_FALLBACK": "50"}, `DNS_UPSTREAM_RATE_LIMIT_KEY="edge"` + needs},
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

	t.Run("exit 2", func(t *testing.T) {
		setEnv(t, withUpstream(map[string]string{"DNS_LISTEN": "127.0.0.1:0", "DNS_METRICS_ADDR": "off",
			"DNS_UPSTREAM_RATE_LIMIT": "300", "DNS_UPSTREAM_RATE_LIMIT_FALLBACK": "50"}))
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // a start-up that is not refused stops at once
		var out, errOut bytes.Buffer
		code := run(ctx, nil, &out, &errOut, nil)
		if want := "dnsproxi: DNS_UPSTREAM_RATE_LIMIT_FALLBACK=\"50\"" + needs + "\n"; code != 2 || errOut.String() != want {
			t.Fatalf("exit %d, stderr %q\nwant exit 2, stderr %q", code, errOut.String(), want)
		}
	})
}
