package cache

import (
	"errors"
	"fmt"
	"time"
)

// Defaults of the Config fields whose zero value means "the default".
const (
	DefaultMaxTTL         = 24 * time.Hour
	DefaultMaxNegativeTTL = time.Hour
	// StaleTTL is the TTL of every record in a stale answer (RFC 8767 §4).
	StaleTTL = 30
	// RecheckAfter is how long a name whose refresh failed is answered
	// stale without asking again: RFC 8767's failure-recheck timer.
	RecheckAfter = 30 * time.Second
)

// MinSize is the smallest cache: its one shard has room for a few of the
// largest messages, and a cache of several has 1 MiB a shard.
const MinSize = 256 << 10

// Config sets a Cache's bound and TTL rules. A zero field takes its
// default; Size has none.
type Config struct {
	// Size bounds the bytes held: every entry's stored bytes plus
	// EntryOverhead, and the ghost table (GhostSlotBytes a slot). At least
	// MinSize.
	Size int64
	// MinTTL raises a shorter TTL (default 0: none is raised). A TTL of 0
	// is never raised: it is not stored.
	MinTTL time.Duration
	// MaxTTL lowers a longer TTL of a positive answer (default 1 day).
	MaxTTL time.Duration
	// MaxNegativeTTL lowers a longer TTL of a negative answer (default 1 h).
	MaxNegativeTTL time.Duration
	// StaleWindow is how long past its expiry an entry may still answer,
	// stale, when a refresh fails (RFC 8767); 0, the default, never.
	StaleWindow time.Duration
	// Prefetch, when true, has Lookup ask for one refresh of an entry hit
	// in the last tenth of its TTL (Hit.Prefetch).
	Prefetch bool
}

// ErrConfig is wrapped by New's errors: a field out of its range.
var ErrConfig = errors.New("cache: bad configuration")

// withDefaults returns cfg with its zero fields set to their defaults, or
// an error naming the first field out of its range.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.MaxTTL == 0 {
		cfg.MaxTTL = DefaultMaxTTL
	}
	if cfg.MaxNegativeTTL == 0 {
		cfg.MaxNegativeTTL = DefaultMaxNegativeTTL
	}
	const most = maxTTL * time.Second
	switch {
	case cfg.Size < MinSize:
		return cfg, fmt.Errorf("%w: Size %d is below %d", ErrConfig, cfg.Size, MinSize)
	case cfg.MinTTL < 0 || cfg.MinTTL > most:
		return cfg, fmt.Errorf("%w: MinTTL %v is not in [0, %v]", ErrConfig, cfg.MinTTL, most)
	case cfg.MaxTTL < time.Second || cfg.MaxTTL > most:
		return cfg, fmt.Errorf("%w: MaxTTL %v is not in [1s, %v]", ErrConfig, cfg.MaxTTL, most)
	case cfg.MaxNegativeTTL < time.Second || cfg.MaxNegativeTTL > most:
		return cfg, fmt.Errorf("%w: MaxNegativeTTL %v is not in [1s, %v]", ErrConfig, cfg.MaxNegativeTTL, most)
	case cfg.MinTTL > cfg.MaxTTL || cfg.MinTTL > cfg.MaxNegativeTTL:
		return cfg, fmt.Errorf("%w: MinTTL %v is above MaxTTL %v or MaxNegativeTTL %v", ErrConfig, cfg.MinTTL, cfg.MaxTTL, cfg.MaxNegativeTTL)
	case cfg.StaleWindow < 0:
		return cfg, fmt.Errorf("%w: StaleWindow %v is negative", ErrConfig, cfg.StaleWindow)
	}
	return cfg, nil
}

// clamp returns ttl seconds within [MinTTL, MaxTTL], or [MinTTL,
// MaxNegativeTTL] for a negative answer; 0 stays 0.
func (cfg *Config) clamp(ttl uint32, negative bool) uint32 {
	if ttl == 0 {
		return 0
	}
	upper := cfg.MaxTTL
	if negative {
		upper = cfg.MaxNegativeTTL
	}
	return min(max(ttl, seconds(cfg.MinTTL)), seconds(upper))
}

// seconds returns d in whole seconds, as a TTL.
func seconds(d time.Duration) uint32 { return uint32(d / time.Second) }
