// Package pool is the set of upstreams dnsproxi forwards to: each upstream
// with its own circuit breaker, the policy that chooses among them, and the
// retries and hedges of one query, all inside the query's one deadline and
// the retry budget.
//
// The rules, in the order a query meets them:
//
//   - Choosing is asking breakers: Acquire walks the upstreams in the
//     policy's order and takes the first whose breaker admits (a half-open
//     breaker's probe is a real query). When every breaker refuses, the
//     query is refused at once: breaker first, never retried through.
//   - One deadline: the query's deadline is Timeout from the first send,
//     and every attempt below ends by it. A client never waits longer than
//     with one upstream.
//   - Retry: an attempt that fails fast (a network error, no valid reply)
//     or answers SERVFAIL or REFUSED is sent once more, to the next upstream
//     the policy gives, while at least a tenth of the deadline is left and
//     the retry budget allows.
//   - Hedge: if the first attempt has not answered after Hedge, the same
//     query also goes to the next upstream (same budget, same deadline). The
//     first good answer wins; SERVFAIL and REFUSED count as good only when
//     nothing better can come. Hedge leaves at least a tenth of the
//     deadline (New refuses more), and the time left is judged when the
//     hedge comes due, so a hedging goroutine waking a little late still
//     sends it.
//   - Outbound limit: every attempt sent pays one token of Config.Outbound,
//     asked right before the send, after the breaker (and, for an extra
//     attempt, after the budget). A first attempt it refuses is no attempt:
//     Acquire returns ErrLimited and gives the breaker's permit back without
//     a sample. A retry or hedge it refuses is simply not sent.
//   - At most two attempts per query, each reporting to its own breaker
//     exactly once when it ends, even after the query was answered by the
//     other; the caller hears of the query exactly once. An extra
//     attempt's timeout with no other reply from its upstream is judged
//     with the first attempt (exchange.go, settle): a slow name's at both
//     costs neither breaker, two silent upstreams both count.
//
// The package knows one upstream only through Forwarder, so it never
// imports the networking, and it knows metrics only through Observer.
package pool

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"dnsproxi/guard"
	"dnsproxi/upstream"
)

// MaxMembers is the most upstreams a pool takes.
const MaxMembers = 16

// Forwarder is one upstream: it sends query over network and reports the
// outcome to done exactly once, by deadline at the latest (*upstream.Upstream
// is one).
type Forwarder interface {
	ForwardUntil(query []byte, network string, deadline time.Time, done upstream.Result)
}

// ForwarderAt is a Forwarder that also takes the caller's reading of the
// real clock and reports with one (*upstream.Upstream is one). A pool on
// the real clock sends through it, so that a query reads the clock once on
// its way out and a batch of replies once on its way back.
type ForwarderAt interface {
	ForwardAt(now time.Time, query []byte, network string, deadline time.Time, done upstream.ResultAt)
}

// Member is one upstream of the pool.
type Member struct {
	Name     string         // the configured address: the value of the upstream label
	Upstream Forwarder      // closed by Pool.Close if it is an io.Closer
	Breaker  *guard.Breaker // nil: it always admits
}

// Config sets up a Pool. Members is required; the zero value of every other
// field is off or takes its default.
type Config struct {
	Members []Member
	Policy  Policy
	Timeout time.Duration // a query's whole deadline, every attempt included (default upstream.DefaultTimeout)
	// Hedge is how long the first attempt may go unanswered before the
	// query also goes to the next upstream; 0: never. It needs a Budget,
	// and must leave a tenth of Timeout for the hedge (ErrHedgeTooLate).
	Hedge time.Duration
	// Budget caps retries and hedges together; nil: neither is ever sent.
	Budget *guard.RetryBudget
	// Valid, if set, is asked about every reply Judge calls an answer; a
	// reply it refuses is a failure (no valid reply). query is the query as
	// given to Forward.
	Valid    func(query, reply []byte) bool
	Observer Observer    // nil: nobody is told
	Clock    guard.Clock // nil: RealClock{}
	// Outbound, if set, is asked for one token right before each attempt
	// is sent, to any upstream: the upstreams together never see more than
	// it allows. nil: no outbound limit. Pool.Close closes it if it is an
	// io.Closer.
	Outbound Outbound
}

// Outbound is an outbound rate limit: Allow takes n tokens if it has them
// and reports whether it did, without waiting. *guard.TokenBucket and the
// fleet's limiter are ones.
type Outbound interface {
	Allow(n int) bool
}

// Observer hears what the pool does, on the goroutine that did it. Its
// methods must be quick and must not block.
type Observer interface {
	Attempt(member int, r AttemptResult, took time.Duration) // an attempt ended
	Retry(r Reason)                                          // an extra attempt was sent
	BudgetExhausted()                                        // the budget refused one
}

// AttemptResult is how one attempt ended, as the metrics name it.
type AttemptResult int

// The results of an attempt.
const (
	AttemptAnswer  AttemptResult = iota // a reply that validates, any rcode
	AttemptTimeout                      // no valid reply before the deadline
	AttemptError                        // anything else: network error, invalid reply, shutdown, never sent
)

// AttemptResults names each result, in order: the values of the result label.
var AttemptResults = []string{"answer", "timeout", "error"}

// String returns "answer", "timeout" or "error".
func (r AttemptResult) String() string { return AttemptResults[r] }

// Reason is why an extra attempt was sent.
type Reason int

// The reasons for an extra attempt.
const (
	RetryFailure Reason = iota // the attempt failed fast
	RetryAnswer                // the attempt answered SERVFAIL or REFUSED
	RetryHedge                 // the attempt had not answered after Config.Hedge
)

// Reasons names each reason, in order: the values of the reason label.
var Reasons = []string{"failure", "answer", "hedge"}

// String returns "failure", "answer" or "hedge".
func (r Reason) String() string { return Reasons[r] }

// ErrNoMembers and ErrTooManyMembers refuse a Config without upstreams or
// with more than MaxMembers, ErrHedgeTooLate one whose hedge would leave
// less than a tenth of the timeout, which every extra attempt needs (the
// hedge would never be sent). ErrLimited is Acquire's when an upstream's
// breaker admitted the query but the outbound limit refused its first
// attempt.
var (
	ErrNoMembers      = errors.New("pool: no upstream")
	ErrTooManyMembers = fmt.Errorf("pool: more than %d upstreams", MaxMembers)
	ErrHedgeTooLate   = errors.New("pool: the hedge leaves less than a tenth of the timeout")
	ErrLimited        = errors.New("pool: the outbound rate limit refused the query")
)

// Pool is a set of upstreams. It is safe for concurrent use. Build it with New.
type Pool struct {
	members []member
	policy  Policy
	timeout time.Duration
	minLeft time.Duration // a retry or hedge needs this much of the deadline left
	hedge   time.Duration
	budget  *guard.RetryBudget
	valid   func(query, reply []byte) bool
	obs     Observer
	clock   guard.Clock
	real    bool     // clock is RealClock: call time.Now directly
	limit   Outbound // nil: no outbound limit

	rotation   atomic.Uint64 // round_robin's starting point; fastest's exploring turn
	lateHedges atomic.Uint64 // hedges the hedger reached only after their deadline
	exchanges  sync.Pool
	hedger     *hedger // nil: no hedging
	closeOnce  sync.Once
}

// member is one upstream and what the pool learns of it.
type member struct {
	name    string
	up      Forwarder
	at      ForwarderAt // up, if it is one and the pool is on the real clock; else nil
	breaker *guard.Breaker
	srtt    atomic.Int64 // smoothed response time in ns; 0: not measured yet
	_       [40]byte     // keeps each member's srtt on a cache line of its own
}

// New returns a pool over cfg.Members. With a hedge, it starts the one
// goroutine that sends hedges; Close stops it.
func New(cfg Config) (*Pool, error) {
	switch {
	case len(cfg.Members) == 0:
		return nil, ErrNoMembers
	case len(cfg.Members) > MaxMembers:
		return nil, ErrTooManyMembers
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = upstream.DefaultTimeout
	}
	if cfg.Hedge > cfg.Timeout-cfg.Timeout/10 {
		return nil, ErrHedgeTooLate
	}
	if cfg.Clock == nil {
		cfg.Clock = guard.RealClock{}
	}
	_, real := cfg.Clock.(guard.RealClock)
	p := &Pool{
		members: make([]member, len(cfg.Members)),
		policy:  cfg.Policy,
		timeout: cfg.Timeout,
		minLeft: cfg.Timeout / 10,
		hedge:   cfg.Hedge,
		budget:  cfg.Budget,
		valid:   cfg.Valid,
		obs:     cfg.Observer,
		clock:   cfg.Clock,
		real:    real,
		limit:   cfg.Outbound,
	}
	for i, m := range cfg.Members {
		p.members[i] = member{name: m.Name, up: m.Upstream, breaker: m.Breaker}
		if at, ok := m.Upstream.(ForwarderAt); ok && real {
			p.members[i].at = at
		}
	}
	p.exchanges.New = func() any { return newExchange(p) }
	if p.hedge > 0 && p.budget != nil && len(p.members) > 1 {
		p.hedger = newHedger(cfg.Clock)
	}
	return p, nil
}

// Close stops the hedging goroutine, then closes every upstream that is an
// io.Closer, and the outbound limit if it is one; the attempts still out
// end (upstream.ErrClosed) and report. Close is idempotent: a second call,
// as from a second shutdown, does nothing and returns nil.
func (p *Pool) Close() error {
	var err error
	p.closeOnce.Do(func() { err = p.close() })
	return err
}

// close is Close's one run.
func (p *Pool) close() error {
	if p.hedger != nil {
		p.hedger.close()
	}
	var errs []error
	if c, ok := p.limit.(io.Closer); ok {
		errs = append(errs, c.Close())
	}
	for i := range p.members {
		if c, ok := p.members[i].up.(io.Closer); ok {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// Len returns how many upstreams the pool has.
func (p *Pool) Len() int { return len(p.members) }

// Name returns upstream i's configured address.
func (p *Pool) Name(i int) string { return p.members[i].name }

// Breaker returns upstream i's breaker, nil if it has none.
func (p *Pool) Breaker(i int) *guard.Breaker { return p.members[i].breaker }

// SmoothedRTT returns upstream i's smoothed response time, 0 before its
// first attempt that counted: what the fastest policy compares. Only good
// answers pull it down (observe).
func (p *Pool) SmoothedRTT(i int) time.Duration { return time.Duration(p.members[i].srtt.Load()) }

// Hedging reports whether the pool sends hedges.
func (p *Pool) Hedging() bool { return p.hedger != nil }

// LateHedges returns how many hedges were not sent because the hedging
// goroutine reached them only after their query's deadline: none unless
// the process stalled for a tenth of the timeout or more.
func (p *Pool) LateHedges() uint64 { return p.lateHedges.Load() }

// Acquire chooses the upstream for a new query by the policy, takes its
// breaker's permit and the first attempt's outbound token. It returns
// guard.ErrOpen, taking nothing, if every breaker refuses, and ErrLimited,
// the permit given back, if the outbound limit does. The caller must then
// call Forward on the Exchange.
func (p *Pool) Acquire() (*Exchange, error) {
	start := p.firstStart()
	i, permit, ok := p.choose(start, 0)
	if !ok {
		return nil, guard.ErrOpen
	}
	if !p.allowOutbound() {
		permit.Cancel() // no call was made: no sample, and a probe's place is freed
		return nil, ErrLimited
	}
	x := p.exchanges.Get().(*Exchange)
	x.begin(i, permit, p.retryStart(start))
	return x, nil
}

// allowOutbound pays one outbound token for an attempt about to be sent.
func (p *Pool) allowOutbound() bool { return p.limit == nil || p.limit.Allow(1) }

func (p *Pool) now() time.Time {
	if p.real {
		return time.Now()
	}
	return p.clock.Now()
}

// observe learns from one attempt of upstream i that took took and ended
// with v, good for the query or not (judgeForQuery): its smoothed response
// time moves an eighth of the way towards took for a good answer, and
// towards the whole timeout for anything else counted (a failure, a
// timeout, SERVFAIL or REFUSED), so that an upstream looks slow when it is
// dead and when it fails at once alike. The Observer hears of it, with
// took.
func (p *Pool) observe(i int, v upstream.Verdict, good bool, err error, took time.Duration) {
	m := &p.members[i]
	if v != upstream.Uncounted {
		sample := int64(took)
		if !good {
			sample = int64(p.timeout)
		}
		// A plain load and store: two attempts racing lose one sample, no more.
		s := m.srtt.Load()
		if s == 0 {
			s = sample
		} else {
			s += (sample - s) / 8
		}
		m.srtt.Store(max(s, 1))
	}
	if p.obs == nil {
		return
	}
	r := AttemptError
	switch {
	case v == upstream.Answer:
		r = AttemptAnswer
	case errors.Is(err, upstream.ErrTimeout):
		r = AttemptTimeout
	}
	p.obs.Attempt(i, r, took)
}

// mark ends a breaker's permit with what the exchange says about the
// upstream: an answer (SERVFAIL included) is a success, a failure a
// failure; shutdown or a slow name's timeout is neither, and a probe's
// place is freed.
func mark(permit guard.Permit, v upstream.Verdict) {
	switch v {
	case upstream.Answer:
		permit.Success()
	case upstream.Failure:
		permit.Failure()
	default:
		permit.Cancel()
	}
}
