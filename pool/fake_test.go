package pool

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
	"dnsproxi/upstream"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// errNet stands for a network error: a fast failure.
var errNet = errors.New("connection refused")

// outcome is what a fake upstream does with one attempt.
type outcome int

const (
	hold     outcome = iota // keep it until the test ends it
	good                    // NOERROR, at once
	servfail                // SERVFAIL, at once
	refused                 // REFUSED, at once
	netErr                  // a network error, at once
	timeout                 // ErrTimeout, at once (as if its deadline had passed)
	closed                  // ErrClosed, at once: shutdown
)

// sent is one attempt a fake upstream was given.
type sent struct {
	member   int
	query    []byte
	deadline time.Time
	done     upstream.Result
}

// fakeUpstream is a Forwarder that does with each attempt what decide
// says; the attempts it holds wait for end.
type fakeUpstream struct {
	member int
	decide func(query []byte) outcome

	mu    sync.Mutex
	sends []sent
	held  []sent
}

func (f *fakeUpstream) ForwardUntil(query []byte, _ string, deadline time.Time, done upstream.Result) {
	s := sent{f.member, append([]byte(nil), query...), deadline, done}
	o := hold
	if f.decide != nil {
		o = f.decide(s.query)
	}
	f.mu.Lock()
	f.sends = append(f.sends, s)
	if o == hold {
		f.held = append(f.held, s)
	}
	f.mu.Unlock()
	if o != hold {
		finish(s, o)
	}
}

// finish reports s as o says, as upstream.Forward would.
func finish(s sent, o outcome) {
	switch o {
	case good, servfail, refused:
		s.done(s.query, reply(s.query, o), nil)
	case netErr:
		s.done(s.query, nil, errNet)
	case timeout:
		s.done(s.query, nil, upstream.ErrTimeout)
	case closed:
		s.done(s.query, nil, upstream.ErrClosed)
	default:
		panic("finish: hold is no outcome")
	}
}

// reply is the answer o to query.
func reply(query []byte, o outcome) []byte {
	req := new(dns.Msg)
	if err := req.Unpack(query); err != nil {
		panic(err)
	}
	m := new(dns.Msg)
	m.SetReply(req)
	switch o {
	case servfail:
		m.Rcode = dns.RcodeServerFailure
	case refused:
		m.Rcode = dns.RcodeRefused
	}
	b, err := m.Pack()
	if err != nil {
		panic(err)
	}
	return b
}

// takeHeld removes and returns the attempts held so far.
func (f *fakeUpstream) takeHeld() []sent {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.held
	f.held = nil
	return h
}

func (f *fakeUpstream) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sends)
}

func (f *fakeUpstream) all() []sent {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sent(nil), f.sends...)
}

// counter is an Observer that counts.
type counter struct {
	attempts atomic.Int64
	byResult [3]atomic.Int64
	retries  [3]atomic.Int64
	refused  atomic.Int64
}

func (c *counter) Attempt(_ int, r AttemptResult, _ time.Duration) {
	c.attempts.Add(1)
	c.byResult[r].Add(1)
}
func (c *counter) Retry(r Reason)   { c.retries[r].Add(1) }
func (c *counter) BudgetExhausted() { c.refused.Add(1) }

// rig is a pool over fake upstreams, each with a breaker on a clock of its
// own, so a test can put each in the state it wants.
type rig struct {
	pool   *Pool
	ups    []*fakeUpstream
	clocks []*guard.ManualClock // the breakers'
	clock  *guard.ManualClock   // the pool's: hedges and deadlines
	obs    *counter
}

// rigConfig is what a rig varies; zero fields: no breakers, no budget, no hedge.
type rigConfig struct {
	n        int
	policy   Policy
	breakers bool
	budget   *guard.RetryBudgetConfig
	hedge    time.Duration
	timeout  time.Duration
	outbound Outbound
}

func newRig(t *testing.T, rc rigConfig) *rig {
	t.Helper()
	r := &rig{clock: guard.NewManualClock(t0), obs: &counter{}}
	cfg := Config{Policy: rc.policy, Hedge: rc.hedge, Timeout: rc.timeout, Observer: r.obs, Clock: r.clock, Outbound: rc.outbound}
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	if rc.budget != nil {
		cfg.Budget = guard.NewRetryBudget(*rc.budget, r.clock)
	}
	for i := range rc.n {
		up := &fakeUpstream{member: i}
		r.ups = append(r.ups, up)
		m := Member{Name: string(rune('a' + i)), Upstream: up}
		if rc.breakers {
			c := guard.NewManualClock(t0)
			r.clocks = append(r.clocks, c)
			m.Breaker = guard.NewBreaker(guard.BreakerConfig{Window: 10, MinSamples: 1, FailThreshold: 0.5, CoolOff: time.Second}, c)
		}
		cfg.Members = append(cfg.Members, m)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	r.pool = p
	return r
}

// result is what the caller of Forward was told.
type result struct {
	query, reply []byte
	err          error
}

// ask acquires and forwards a query for name; its report arrives on the
// returned channel (buffered: it never blocks the reporter). err is
// Acquire's.
func (r *rig) ask(name string) (<-chan result, error) {
	ch := make(chan result, 2) // room for a second report, which the tests must catch
	x, err := r.pool.Acquire()
	if err != nil {
		return nil, err
	}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), dns.TypeA)
	b, _ := m.Pack()
	x.Forward(b, "udp", func(query, reply []byte, err error) {
		ch <- result{append([]byte(nil), query...), append([]byte(nil), reply...), err}
	})
	return ch, nil
}

// wait returns the one report on ch, failing after 5 s.
func wait(t *testing.T, ch <-chan result) result {
	t.Helper()
	select {
	case res := <-ch:
		return res
	case <-time.After(5 * time.Second):
		t.Fatal("no report within 5s")
		return result{}
	}
}

// none fails if ch holds a report.
func none(t *testing.T, ch <-chan result, what string) {
	t.Helper()
	select {
	case res := <-ch:
		t.Fatalf("%s: a report came (%v, %d bytes)", what, res.err, len(res.reply))
	default:
	}
}

// rcode reads a report's rcode; -1 without a reply.
func rcode(res result) int {
	if len(res.reply) < 4 {
		return -1
	}
	return int(res.reply[3] & 0x0f)
}

// waitUntil polls cond until it holds, failing after 5 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitProbeFree waits until b's half-open probe is free to take. An extra
// attempt that is not sent gives its probe back on the hedger's goroutine
// once the outbound limit's answer returns, which may be just after the
// query's report.
func waitProbeFree(t *testing.T, b *guard.Breaker, what string) {
	t.Helper()
	waitUntil(t, what, func() bool {
		p, err := b.Acquire()
		if err != nil {
			return false
		}
		p.Cancel()
		return true
	})
}

// nextQueryReusesExchange asks one more query, which takes the Exchange
// the last one gave back, and wants it answered on its own (REFUSED by both
// upstreams) while ch, the earlier query's, hears nothing more.
func (r *rig) nextQueryReusesExchange(t *testing.T, ch <-chan result) {
	t.Helper()
	r.ups[0].decide = func([]byte) outcome { return refused }
	r.ups[1].decide = func([]byte) outcome { return refused }
	ch2, err := r.ask("next.example")
	if err != nil {
		t.Fatal(err)
	}
	if res := wait(t, ch2); rcode(res) != dns.RcodeRefused {
		t.Fatalf("the next query: rcode %d (%v), want REFUSED", rcode(res), res.err)
	}
	none(t, ch, "the first query, after the Exchange's reuse")
}
