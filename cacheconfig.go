package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"dnsproxi/cache"
)

// The answer cache's variables, named in the errors of the rules that tie
// them to one another and to DNS_UPSTREAM_TIMEOUT.
const (
	keyCacheSize      = "DNS_CACHE_SIZE"
	keyCacheMinTTL    = "DNS_CACHE_MIN_TTL"
	keyCacheMaxTTL    = "DNS_CACHE_MAX_TTL"
	keyCacheMaxNegTTL = "DNS_CACHE_MAX_NEGATIVE_TTL"
	keyCacheStale     = "DNS_CACHE_STALE"
	keyCacheStaleWait = "DNS_CACHE_STALE_WAIT"
	keyCachePrefetch  = "DNS_CACHE_PREFETCH"
)

// maxCacheSize bounds DNS_CACHE_SIZE: far more than a forwarder's working
// set, and small enough that a typo (64TB) is caught at start-up rather than
// by the kernel later.
const maxCacheSize = 64 << 30

// ByteSize is DNS_CACHE_SIZE: a number of bytes, 0 for none. The zero value
// is no cache.
type ByteSize int64

// byteUnits are the units a ByteSize may be written with, powers of 1024,
// longest suffix first so that "MB" is not read as "B".
var byteUnits = []struct {
	suffix string
	size   int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30},
	{"kb", 1 << 10}, {"mb", 1 << 20}, {"gb", 1 << 30},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"b", 1},
}

var errByteSize = fmt.Errorf("must be a size such as 64MB (a whole number and B, KB, MB or GB, powers of 1024) from %s to %s, or 0 or off",
	ByteSize(cache.MinSize), ByteSize(maxCacheSize))

// Decode parses a whole number with an optional unit (any case, spaces
// allowed between), "0", "off" or nothing (no cache). A size below
// cache.MinSize or above 64GB is refused.
func (s *ByteSize) Decode(text string) error {
	text = strings.ToLower(strings.TrimSpace(text))
	if text == "" || text == "off" || text == "0" {
		*s = 0
		return nil
	}
	unit := int64(1)
	for _, u := range byteUnits {
		if n, ok := strings.CutSuffix(text, u.suffix); ok {
			text, unit = strings.TrimSpace(n), u.size
			break
		}
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil || n < 0 || n > maxCacheSize/unit {
		return errByteSize
	}
	if n*unit < cache.MinSize || n*unit > maxCacheSize {
		return errByteSize
	}
	*s = ByteSize(n * unit)
	return nil
}

// String formats the size in the largest unit that divides it, as
// DNS_CACHE_SIZE takes it; 0 is "off".
func (s ByteSize) String() string {
	switch {
	case s == 0:
		return "off"
	case s%(1<<30) == 0:
		return strconv.FormatInt(int64(s)>>30, 10) + "GB"
	case s%(1<<20) == 0:
		return strconv.FormatInt(int64(s)>>20, 10) + "MB"
	case s%(1<<10) == 0:
		return strconv.FormatInt(int64(s)>>10, 10) + "KB"
	}
	return strconv.FormatInt(int64(s), 10) + "B"
}

// errWholeSeconds is what a TTL variable expects beyond its range: a TTL
// counts whole seconds.
var errWholeSeconds = errors.New("must be a whole number of seconds, such as 30s or 5m")

// checkCache applies the rules that tie the cache's variables together. A
// variable of the cache set while the cache is off is refused rather than
// ignored: the operator meant something that would not happen. A rule broken
// by a default names the variable the operator did set.
func (c *Config) checkCache(given envText) error {
	if c.CacheSize == 0 {
		for _, key := range []string{keyCacheMinTTL, keyCacheMaxTTL, keyCacheMaxNegTTL, keyCacheStale, keyCacheStaleWait, keyCachePrefetch} {
			if text, ok := given[key]; ok {
				return fmt.Errorf("%s=%q: needs %s: the cache is off", key, text, keyCacheSize)
			}
		}
		return nil
	}
	for _, ttl := range []struct {
		key string
		d   time.Duration
	}{{keyCacheMinTTL, c.CacheMinTTL}, {keyCacheMaxTTL, c.CacheMaxTTL}, {keyCacheMaxNegTTL, c.CacheMaxNegativeTTL}} {
		if ttl.d%time.Second != 0 {
			return fmt.Errorf("%s=%q: %v", ttl.key, given[ttl.key], errWholeSeconds)
		}
	}
	for _, upper := range []struct {
		key string
		d   time.Duration
	}{{keyCacheMaxTTL, c.CacheMaxTTL}, {keyCacheMaxNegTTL, c.CacheMaxNegativeTTL}} {
		if c.CacheMinTTL <= upper.d {
			continue
		}
		if _, set := given[upper.key]; set {
			return fmt.Errorf("%s=%q: must not be below %s (%v)", upper.key, given[upper.key], keyCacheMinTTL, c.CacheMinTTL)
		}
		return fmt.Errorf("%s=%q: must not exceed %s (%v, its default)", keyCacheMinTTL, given[keyCacheMinTTL], upper.key, upper.d)
	}
	_, waitSet := given[keyCacheStaleWait]
	switch {
	case c.CacheStale == 0 && waitSet:
		return fmt.Errorf("%s=%q: needs %s: serve-stale is off", keyCacheStaleWait, given[keyCacheStaleWait], keyCacheStale)
	case c.CacheStale == 0 || c.CacheStaleWait < c.UpstreamTimeout:
		return nil
	case waitSet:
		return fmt.Errorf("%s=%q: must be shorter than %s (%v): the stale answer must come before the upstream's deadline",
			keyCacheStaleWait, given[keyCacheStaleWait], keyUpstreamTimeout, c.UpstreamTimeout)
	}
	return fmt.Errorf("%s=%q: must exceed %s (%v, its default) while serve-stale is on",
		keyUpstreamTimeout, given.or(keyUpstreamTimeout, c.UpstreamTimeout.String()), keyCacheStaleWait, c.CacheStaleWait)
}

// cacheConfig is the cache package's configuration for cfg.
func cacheConfig(cfg Config) cache.Config {
	return cache.Config{
		Size:           int64(cfg.CacheSize),
		MinTTL:         cfg.CacheMinTTL,
		MaxTTL:         cfg.CacheMaxTTL,
		MaxNegativeTTL: cfg.CacheMaxNegativeTTL,
		StaleWindow:    cfg.CacheStale,
		Prefetch:       cfg.CachePrefetch,
	}
}

// cacheSummary describes the cache for the start-up log.
func cacheSummary(cfg Config) string {
	if cfg.CacheSize == 0 {
		return "off"
	}
	s := fmt.Sprintf("%s, TTL %v..%v (negative ..%v)", cfg.CacheSize, cfg.CacheMinTTL, cfg.CacheMaxTTL, cfg.CacheMaxNegativeTTL)
	if cfg.CacheStale > 0 {
		s += fmt.Sprintf(", stale up to %v after %v", cfg.CacheStale, cfg.CacheStaleWait)
	}
	if cfg.CachePrefetch {
		s += ", prefetch"
	}
	return s
}
