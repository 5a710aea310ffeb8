package main

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"
)

func TestCacheConfigGood(t *testing.T) {
	tests := []goodConfig{
		{map[string]string{"DNS_CACHE_SIZE": "64MB"}, func(c Config) bool { return c.CacheSize == 64<<20 && c.CacheStale == 0 }},
		{map[string]string{"DNS_CACHE_SIZE": " 512 kib "}, func(c Config) bool { return c.CacheSize == 512<<10 }},
		{map[string]string{"DNS_CACHE_SIZE": "256KB"}, func(c Config) bool { return c.CacheSize == 256<<10 }},
		{map[string]string{"DNS_CACHE_SIZE": "2G"}, func(c Config) bool { return c.CacheSize == 2<<30 }},
		{map[string]string{"DNS_CACHE_SIZE": "1048576"}, func(c Config) bool { return c.CacheSize == 1<<20 }},
		{map[string]string{"DNS_CACHE_SIZE": "OFF"}, func(c Config) bool { return c.CacheSize == 0 }},
		{map[string]string{"DNS_CACHE_SIZE": "0"}, func(c Config) bool { return c.CacheSize == 0 }},
		{map[string]string{"DNS_CACHE_SIZE": "1MB", "DNS_CACHE_MIN_TTL": "30s", "DNS_CACHE_MAX_TTL": "1h", "DNS_CACHE_MAX_NEGATIVE_TTL": "5m"},
			func(c Config) bool {
				return c.CacheMinTTL == 30*time.Second && c.CacheMaxTTL == time.Hour && c.CacheMaxNegativeTTL == 5*time.Minute
			}},
		{map[string]string{"DNS_CACHE_SIZE": "1MB", "DNS_CACHE_STALE": "72h", "DNS_CACHE_PREFETCH": "on"}, func(c Config) bool {
			return c.CacheStale == 72*time.Hour && c.CacheStaleWait == 1800*time.Millisecond && c.CachePrefetch
		}},
		{map[string]string{"DNS_CACHE_SIZE": "1MB", "DNS_CACHE_STALE": "1h", "DNS_CACHE_STALE_WAIT": "0s"}, func(c Config) bool {
			return c.CacheStaleWait == 0
		}},
		{map[string]string{"DNS_CACHE_SIZE": "1MB", "DNS_CACHE_STALE": "1h", "DNS_UPSTREAM_TIMEOUT": "5s", "DNS_CACHE_STALE_WAIT": "4s"},
			func(c Config) bool { return c.CacheStaleWait == 4*time.Second }},
	}
	loadsAs(t, tests)
}

// Every bad value of a cache variable, and every contradiction, stops run
// before anything is bound: exit 2 and one line naming the variable, the
// value and what is expected.
func TestCacheConfigBadExit2(t *testing.T) {
	const size = "must be a size such as 64MB (a whole number and B, KB, MB or GB, powers of 1024) from 256KB to 64GB, or 0 or off"
	on := func(env map[string]string) map[string]string {
		out := map[string]string{"DNS_CACHE_SIZE": "1MB"}
		maps.Copy(out, env)
		return out
	}
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"DNS_CACHE_SIZE": "64"}, `DNS_CACHE_SIZE="64": ` + size},
		{map[string]string{"DNS_CACHE_SIZE": "255KB"}, `DNS_CACHE_SIZE="255KB": ` + size},
		{map[string]string{"DNS_CACHE_SIZE": "65GB"}, `DNS_CACHE_SIZE="65GB": ` + size},
		{map[string]string{"DNS_CACHE_SIZE": "9223372036854775807GB"}, `DNS_CACHE_SIZE="9223372036854775807GB": ` + size},
		{map[string]string{"DNS_CACHE_SIZE": "1.5MB"}, `DNS_CACHE_SIZE="1.5MB": ` + size},
		{map[string]string{"DNS_CACHE_SIZE": "-1MB"}, `DNS_CACHE_SIZE="-1MB": ` + size},
		{map[string]string{"DNS_CACHE_SIZE": "64TB"}, `DNS_CACHE_SIZE="64TB": ` + size},
		{map[string]string{"DNS_CACHE_SIZE": "MB"}, `DNS_CACHE_SIZE="MB": ` + size},
		{on(map[string]string{"DNS_CACHE_MIN_TTL": "2h"}), `DNS_CACHE_MIN_TTL="2h": must be a duration from 0s to 1h, such as 500ms or 2s`},
		{on(map[string]string{"DNS_CACHE_MIN_TTL": "1.5s"}), `DNS_CACHE_MIN_TTL="1.5s": must be a whole number of seconds, such as 30s or 5m`},
		{on(map[string]string{"DNS_CACHE_MAX_TTL": "0s"}), `DNS_CACHE_MAX_TTL="0s": must be a duration from 1s to 168h, such as 500ms or 2s`},
		{on(map[string]string{"DNS_CACHE_MAX_TTL": "1500ms"}), `DNS_CACHE_MAX_TTL="1500ms": must be a whole number of seconds, such as 30s or 5m`},
		{on(map[string]string{"DNS_CACHE_MAX_NEGATIVE_TTL": "2d"}), `DNS_CACHE_MAX_NEGATIVE_TTL="2d": must be a duration from 1s to 24h, such as 500ms or 2s`},
		{on(map[string]string{"DNS_CACHE_STALE": "-1h"}), `DNS_CACHE_STALE="-1h": must be a duration from 0s to 168h, such as 500ms or 2s`},
		{on(map[string]string{"DNS_CACHE_STALE_WAIT": "1min"}), `DNS_CACHE_STALE_WAIT="1min": must be a duration from 0s to 30s, such as 500ms or 2s`},
		{on(map[string]string{"DNS_CACHE_PREFETCH": "sometimes"}), `DNS_CACHE_PREFETCH="sometimes": must be on or off (also true/false, 1/0)`},
		// Contradictions.
		{map[string]string{"DNS_CACHE_STALE": "1h"}, `DNS_CACHE_STALE="1h": needs DNS_CACHE_SIZE: the cache is off`},
		{map[string]string{"DNS_CACHE_SIZE": "off", "DNS_CACHE_PREFETCH": "on"}, `DNS_CACHE_PREFETCH="on": needs DNS_CACHE_SIZE: the cache is off`},
		{on(map[string]string{"DNS_CACHE_MIN_TTL": "10m", "DNS_CACHE_MAX_TTL": "5m"}), `DNS_CACHE_MAX_TTL="5m": must not be below DNS_CACHE_MIN_TTL (10m0s)`},
		{on(map[string]string{"DNS_CACHE_MIN_TTL": "1h", "DNS_CACHE_MAX_NEGATIVE_TTL": "30m"}), `DNS_CACHE_MAX_NEGATIVE_TTL="30m": must not be below DNS_CACHE_MIN_TTL (1h0m0s)`},
		{on(map[string]string{"DNS_CACHE_MIN_TTL": "1h", "DNS_CACHE_MAX_TTL": "2h", "DNS_CACHE_MAX_NEGATIVE_TTL": "1h"}), ""},
		{on(map[string]string{"DNS_CACHE_STALE_WAIT": "1s"}), `DNS_CACHE_STALE_WAIT="1s": needs DNS_CACHE_STALE: serve-stale is off`},
		{on(map[string]string{"DNS_CACHE_STALE": "1h", "DNS_CACHE_STALE_WAIT": "2s"}),
			`DNS_CACHE_STALE_WAIT="2s": must be shorter than DNS_UPSTREAM_TIMEOUT (2s): the stale answer must come before the upstream's deadline`},
		{on(map[string]string{"DNS_CACHE_STALE": "1h", "DNS_UPSTREAM_TIMEOUT": "1s"}),
			`DNS_UPSTREAM_TIMEOUT="1s": must exceed DNS_CACHE_STALE_WAIT (1.8s, its default) while serve-stale is on`},
	}
	for _, tt := range tests {
		t.Run(envString(tt.env), func(t *testing.T) {
			env := map[string]string{"DNS_LISTEN": "127.0.0.1:0", "DNS_METRICS_ADDR": "off", "DNS_UPSTREAM": "127.0.0.1:5300"}
			maps.Copy(env, tt.env)
			setEnv(t, env)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			var stdout, stderr syncBuffer
			code := run(ctx, nil, &stdout, &stderr, nil)
			if tt.want == "" { // the one allowed: MIN_TTL equal to both maxima
				if code != 0 {
					t.Fatalf("exit %d: %s", code, stderr.String())
				}
				return
			}
			if code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if got, want := stderr.String(), "dnsproxi: "+tt.want+"\n"; got != want {
				t.Errorf("stderr %q\nwant   %q", got, want)
			}
		})
	}
}

// What -h says of the cache, and how a size prints back.
func TestCacheConfigUsageAndSizeString(t *testing.T) {
	u := usage()
	for _, v := range []string{"DNS_CACHE_SIZE", "DNS_CACHE_STALE_WAIT", "DNS_CACHE_PREFETCH"} {
		if !strings.Contains(u, v) {
			t.Errorf("-h does not mention %s", v)
		}
	}
	for _, tt := range []struct {
		s    ByteSize
		want string
	}{{0, "off"}, {256 << 10, "256KB"}, {64 << 20, "64MB"}, {2 << 30, "2GB"}, {(1 << 20) + 1, "1048577B"}} {
		if got := tt.s.String(); got != tt.want {
			t.Errorf("ByteSize(%d) = %q, want %q", int64(tt.s), got, tt.want)
		}
		var back ByteSize
		if tt.s >= 256<<10 {
			if err := back.Decode(tt.want); err != nil || back != tt.s {
				t.Errorf("%q read back as %d, %v", tt.want, back, err)
			}
		}
	}
}
