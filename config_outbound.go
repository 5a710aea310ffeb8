package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"dnsproxi/fleet"
)

// The outbound limit's variables, named in their errors.
const (
	keyOutbound         = "DNS_UPSTREAM_RATE_LIMIT"
	keyOutboundRedis    = "DNS_UPSTREAM_RATE_LIMIT_REDIS"
	keyOutboundKey      = "DNS_UPSTREAM_RATE_LIMIT_KEY"
	keyOutboundFallback = "DNS_UPSTREAM_RATE_LIMIT_FALLBACK"
	keyOutboundTimeout  = "DNS_UPSTREAM_RATE_LIMIT_REDIS_TIMEOUT"
)

// fleetOnlyVars tune the fleet's limit on Redis and nothing else: given
// without DNS_UPSTREAM_RATE_LIMIT_REDIS they would be read and ignored.
var fleetOnlyVars = []string{keyOutboundKey, keyOutboundTimeout, keyOutboundFallback}

// RedisURL is DNS_UPSTREAM_RATE_LIMIT_REDIS, as it was given. Reading it
// never fails, so that no generic error can quote its password:
// checkOutbound judges it, and String shows it redacted.
type RedisURL string

// Decode keeps s; checkOutbound judges it.
func (u *RedisURL) Decode(s string) error {
	*u = RedisURL(s)
	return nil
}

// String returns the URL with its password redacted, or "off".
func (u RedisURL) String() string {
	if u == "" {
		return "off"
	}
	return fleet.RedactURL(string(u))
}

// Fallback is DNS_UPSTREAM_RATE_LIMIT_FALLBACK: queries per second. The
// zero value is the whole rate.
type Fallback float64

// errFallback is what DNS_UPSTREAM_RATE_LIMIT_FALLBACK expects.
var errFallback = fmt.Errorf("must be a number of queries per second from %s up to %s's rate, or unset (the whole rate)", formatRate(minRate), keyOutbound)

// Decode reads a rate from minRate to maxRate.
func (f *Fallback) Decode(s string) error {
	rate, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || !(rate >= minRate && rate <= maxRate) {
		return errFallback
	}
	*f = Fallback(rate)
	return nil
}

// checkOutbound applies the rules that tie the outbound limit's variables
// together. The Redis URL is judged here, not by readEnv, and every error
// shows it with its password redacted.
func (c *Config) checkOutbound(given envText) error {
	if strings.ContainsAny(c.UpstreamRateLimitKey, "{}") {
		return fmt.Errorf("%s=%q: must not contain braces: dnsproxi wraps the key in a Redis Cluster hash tag", keyOutboundKey, given[keyOutboundKey])
	}
	if c.UpstreamRateLimitRedis == "" {
		for _, key := range fleetOnlyVars {
			if text, ok := given[key]; ok {
				return fmt.Errorf("%s=%q: applies only to the fleet's limit on Redis, and %s is unset", key, text, keyOutboundRedis)
			}
		}
	}
	rate := c.UpstreamRateLimit.Rate
	if f := float64(c.UpstreamRateLimitFallback); c.UpstreamRateLimit.On() && f > rate {
		return fmt.Errorf("%s=%q: must not exceed %s's rate (%s): it is a share of it", keyOutboundFallback, given[keyOutboundFallback], keyOutbound, formatRate(rate))
	}
	if c.UpstreamRateLimitRedis == "" {
		return nil
	}
	shown := fleet.RedactURL(given[keyOutboundRedis])
	if !c.UpstreamRateLimit.On() {
		return fmt.Errorf("%s=%q: needs %s, the fleet's total rate, which is off", keyOutboundRedis, shown, keyOutbound)
	}
	var bad *fleet.URLError
	if err := fleet.CheckURL(string(c.UpstreamRateLimitRedis)); errors.As(err, &bad) {
		return fmt.Errorf("%s=%q: %s", keyOutboundRedis, shown, bad.Reason)
	} else if err != nil {
		return fmt.Errorf("%s=%q: %v", keyOutboundRedis, shown, err)
	}
	return nil
}

// outboundSummary describes the outbound limit for the start-up log.
func outboundSummary(cfg Config) string {
	if !cfg.UpstreamRateLimit.On() {
		return "off"
	}
	if cfg.UpstreamRateLimitRedis == "" {
		return cfg.UpstreamRateLimit.String() + " (this instance)"
	}
	fallback := cfg.UpstreamRateLimit.Rate
	if cfg.UpstreamRateLimitFallback > 0 {
		fallback = float64(cfg.UpstreamRateLimitFallback)
	}
	return fmt.Sprintf("%s for the fleet on %s key %s, timeout %v, fallback %s",
		cfg.UpstreamRateLimit, cfg.UpstreamRateLimitRedis, cfg.UpstreamRateLimitKey,
		cfg.UpstreamRateLimitTimeout, formatRate(fallback))
}
