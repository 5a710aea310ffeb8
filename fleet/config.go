package fleet

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"dnsproxi/guard"
)

// Defaults for the zero fields of Config.
const (
	// DefaultKey names the shared bucket when Config.Key is empty.
	DefaultKey = "dnsproxi"
	// DefaultTimeout bounds each Redis call when Config.Timeout is zero.
	DefaultTimeout = 50 * time.Millisecond
)

// Sentinel errors of New; the returned error wraps one of them and never
// shows the URL's password.
var (
	// ErrURL means Config.URL does not name a Redis server this package can use.
	ErrURL = errors.New("fleet: bad Redis URL")
	// ErrConfig means a field of Config other than the URL is out of range.
	ErrConfig = errors.New("fleet: bad configuration")
)

// Config describes one instance's view of the fleet's limit. The zero value
// of every field but URL and Rate falls back to the default its comment gives.
type Config struct {
	// URL is the Redis server: redis://[user:password@]host[:port][/db], or
	// rediss:// for TLS. Port 6379 and db 0 when left out. No query string:
	// the timeouts come from Timeout alone.
	URL string
	// Key names the shared bucket; every instance naming the same Redis and
	// Key shares one rate. Default DefaultKey. It must not contain braces:
	// the package wraps it in a hash tag so every key the script touches lands
	// in one Redis Cluster slot.
	Key string
	// Rate is the fleet's total, in tokens per second. It must be > 0.
	Rate float64
	// Burst is the most the fleet's bucket holds. Default: Rate rounded up.
	Burst int
	// Timeout bounds every Redis call, dial included: a call that fails or
	// takes longer switches the instance to its local share. Default
	// DefaultTimeout; negative is an error.
	Timeout time.Duration
	// Fallback is the local rate, in tokens per second, before Redis has
	// ever answered (the share once it has is Rate ÷ the largest fleet seen
	// lately). Default: Rate, so that a lone instance is not throttled by a
	// Redis it cannot reach. It must not exceed Rate.
	Fallback float64
	// Clock reads time for the lease's expiry, the local bucket and the
	// pace of Redis calls. Default guard.RealClock{}. The shared bucket reads
	// Redis's own TIME.
	Clock guard.Clock
	// OnSwitch, when set, is told each change of mode once, on the
	// limiter's own goroutine (the first report, From ModeStarting, on the
	// caller of New). It must not block: a slow consumer delays the refill.
	OnSwitch func(Switch)
}

// settings is a validated Config with its defaults filled in.
type settings struct {
	Config
	server redisTarget
}

// validate checks c and fills in its defaults. Its errors show the URL with
// the password redacted.
func validate(c Config) (settings, error) {
	s := settings{Config: c}
	target, err := parseURL(c.URL)
	if err != nil {
		return settings{}, err
	}
	s.server = target
	if s.Key == "" {
		s.Key = DefaultKey
	}
	if strings.ContainsAny(s.Key, "{}") {
		return settings{}, fmt.Errorf("%w: key %q must not contain braces (the package adds the hash tag)", ErrConfig, s.Key)
	}
	if !(c.Rate > 0) || math.IsInf(c.Rate, 0) {
		return settings{}, fmt.Errorf("%w: rate must be a number > 0, got %v", ErrConfig, c.Rate)
	}
	if s.Burst == 0 {
		s.Burst = int(min(math.Ceil(c.Rate), math.MaxInt32))
	}
	if s.Burst < 1 {
		return settings{}, fmt.Errorf("%w: burst must be >= 1, got %d", ErrConfig, c.Burst)
	}
	switch {
	case c.Timeout < 0:
		return settings{}, fmt.Errorf("%w: timeout must be > 0, got %v", ErrConfig, c.Timeout)
	case c.Timeout == 0:
		s.Timeout = DefaultTimeout
	}
	switch {
	case math.IsNaN(c.Fallback) || c.Fallback < 0 || c.Fallback > c.Rate:
		return settings{}, fmt.Errorf("%w: fallback must be from 0 (the whole rate) to the rate %v, got %v", ErrConfig, c.Rate, c.Fallback)
	case c.Fallback == 0:
		s.Fallback = c.Rate
	}
	if s.Clock == nil {
		s.Clock = guard.RealClock{}
	}
	return s, nil
}

// share is the local bucket for an instance that last saw instances
// members, holding its part of the fleet's rate and burst (at least one token).
func (s *settings) share(instances int) (rate float64, burst int) {
	return s.part(s.Rate / float64(max(instances, 1)))
}

// part scales the burst with a rate taken out of the fleet's.
func (s *settings) part(rate float64) (float64, int) {
	burst := int(math.Floor(float64(s.Burst) * rate / s.Rate))
	return rate, max(burst, 1)
}
