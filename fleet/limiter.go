// Package fleet is an outbound rate limit shared by every dnsproxi naming the
// same Redis and key: the fleet's total stays at the configured rate however
// many instances run. It keeps Redis off the query path: each instance leases
// blocks of tokens from a bucket kept by a Lua script on Redis and spends them
// locally; when Redis fails or is slow, it falls back to a local
// guard.TokenBucket holding its share of the rate, and returns to the shared
// bucket once Redis answers again. It never fails open and never refuses
// everything. The package does not log: switches are reported through
// Config.OnSwitch and counted.
package fleet

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
	"github.com/redis/go-redis/v9/maintnotifications"

	"dnsproxi/guard"
)

// Mode says where an instance's tokens come from.
type Mode int32

// The modes of a Limiter.
const (
	// ModeStarting is the mode before New's first call to Redis; it only
	// appears as the From of the first Switch.
	ModeStarting Mode = iota
	// ModeLocal spends a local bucket: the fleet's rate ÷ the largest fleet
	// seen within a membership's life, or Config.Fallback before Redis has
	// ever answered.
	ModeLocal
	// ModeShared spends leases from the fleet's bucket on Redis.
	ModeShared
)

// String returns "starting", "local" or "shared".
func (m Mode) String() string {
	switch m {
	case ModeStarting:
		return "starting"
	case ModeLocal:
		return "local"
	case ModeShared:
		return "shared"
	}
	return "unknown"
}

// Switch reports a change of mode.
type Switch struct {
	// From and To are the modes before and after; the first report, from
	// New, has From ModeStarting.
	From, To Mode
	// Instances is the fleet's size last seen on Redis, 0 if never.
	Instances int
	// Rate is the local bucket's rate when To is ModeLocal, else 0.
	Rate float64
	// Err says why Redis was left (wrapping ErrRedis, password redacted),
	// nil when To is ModeShared.
	Err error
}

// Calls counts the Redis calls made, by result: OK answered in time, Error
// failed (refused, reset, a bad reply), Timeout ran past Config.Timeout.
type Calls struct {
	OK, Error, Timeout uint64
}

// Limiter is an outbound rate limit shared by a fleet on Redis. It is safe
// for concurrent use. Build it with New; Close stops its goroutine.
type Limiter struct {
	lease lease
	_     [64]byte // keep the goroutine's bookkeeping off the hot cache line

	asking atomic.Bool                       // Allow has asked for a block not yet requested
	unmet  atomic.Int64                      // tokens asked of Allow beyond the lease, for the demand
	local  atomic.Pointer[guard.TokenBucket] // the local bucket, nil in shared mode
	mode   atomic.Int32                      // a Mode
	fleet  atomic.Int64                      // instances last seen
	// spentLocal is what the local bucket let through since the last call
	// that reached Redis: that call charges it to the shared bucket.
	spentLocal atomic.Int64
	calls      [callResults]atomic.Uint64 // Redis calls by result
	begun      atomic.Uint64              // Redis calls started
	wake       chan struct{}              // Allow asks the goroutine for a block
	stop       chan struct{}              // closed by Close
	done       chan struct{}              // closed when the goroutine ends

	s         settings
	rdb       *redis.Client
	keys      []string
	member    string
	closeOnce sync.Once
	loop      loopState // owned by the goroutine (by New before it starts)
}

// New returns a limiter for the fleet described by c. It makes one call to
// Redis, bounded by the timeout, before it returns: a Redis that answers
// starts it in shared mode, one that does not in local mode with
// c.Fallback (not an error; the first Switch says which). Errors come only
// from the configuration, wrap ErrURL or ErrConfig, and never show the
// password.
func New(c Config) (*Limiter, error) {
	l, err := newLimiter(c)
	if err != nil {
		return nil, err
	}
	go l.run()
	return l, nil
}

// silenceClient turns off go-redis's own logger, once per process: it would
// print every failed dial to stderr by itself, while this package reports a
// switch once, through OnSwitch, and leaves logging to its caller. The logger
// is global to go-redis; dnsproxi has no other user of it.
var silenceClient = sync.OnceFunc(logging.Disable)

// newLimiter is New without the goroutine: tests drive step by hand.
func newLimiter(c Config) (*Limiter, error) {
	s, err := validate(c)
	if err != nil {
		return nil, err
	}
	silenceClient()
	member := newMemberID()
	l := &Limiter{
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		s:      s,
		rdb:    redis.NewClient(clientOptions(s)),
		keys:   callKeys(s.Key, member),
		member: member,
	}
	l.loop.start(l, s.Clock.Now())
	return l, nil
}

// clientOptions fixes every timeout of the client to the configured one,
// turns off what would add calls or waits the limiter did not ask for, and
// reads every connection through a guard on the replies' sizes.
func clientOptions(s settings) *redis.Options {
	o := *s.server.options
	o.DialTimeout = s.Timeout
	o.ReadTimeout = s.Timeout
	o.WriteTimeout = s.Timeout
	o.PoolTimeout = s.Timeout
	o.ContextTimeoutEnabled = true
	o.MaxRetries = -1
	o.DialerRetries = 1
	o.PoolSize = 2 // the goroutine's calls, and Close's
	o.MinIdleConns = 0
	o.Protocol = 2
	o.DisableIdentity = true
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	o.Dialer = guardDialer(redis.NewDialer(&o)) // no reply sized by a header above a small cap (resp.go)
	return &o
}

// newMemberID names this instance in the fleet's membership set.
func newMemberID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Allow takes n tokens if the instance has them and reports whether it did:
// from the lease in hand, else (in local mode) from the local bucket. It
// never waits on Redis and does not allocate. n <= 0 takes nothing and is
// allowed.
func (l *Limiter) Allow(n int) bool {
	if n <= 0 {
		return true
	}
	ok, ask := l.lease.take(int64(n))
	if ask && !l.asking.Load() && l.asking.CompareAndSwap(false, true) {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
	if ok {
		return true
	}
	l.unmet.Add(int64(n))
	if b := l.local.Load(); b != nil && b.Allow(n) {
		l.spentLocal.Add(int64(n)) // charged to the shared bucket when Redis answers again
		return true
	}
	return false
}

// Mode returns where the tokens come from now: ModeShared or ModeLocal.
func (l *Limiter) Mode() Mode { return Mode(l.mode.Load()) }

// Instances returns the fleet's size last seen on Redis (this instance
// included), 0 before Redis has answered.
func (l *Limiter) Instances() int { return int(l.fleet.Load()) }

// LeaseTokens returns the tokens in hand from the shared bucket.
func (l *Limiter) LeaseTokens() int64 { return l.lease.tokens.Load() }

// RedisCalls returns the Redis calls made so far, by result.
func (l *Limiter) RedisCalls() Calls {
	return Calls{
		OK:      l.calls[callOK].Load(),
		Error:   l.calls[callError].Load(),
		Timeout: l.calls[callTimeout].Load(),
	}
}

// Switches returns how many times the mode changed after New returned.
func (l *Limiter) Switches() uint64 { return l.loop.switches.Load() }

// Close stops the limiter's goroutine, takes the instance out of the fleet's
// membership (one call, bounded by the timeout) and closes the client.
// Allow still spends what is in hand afterwards, and the local bucket in
// local mode, but nothing is refilled from Redis. Close is idempotent.
func (l *Limiter) Close() error {
	var err error
	l.closeOnce.Do(func() {
		close(l.stop)
		<-l.done
		l.loop.leave(l)
		err = l.rdb.Close()
	})
	return err
}

// ensure Allow keeps its shape for the proxy's gate.
var _ interface{ Allow(int) bool } = (*Limiter)(nil)

// now reads the configured clock.
func (l *Limiter) now() time.Time { return l.s.Clock.Now() }
