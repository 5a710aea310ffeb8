package pool

import (
	"errors"
	"sync"
	"time"

	"dnsproxi/guard"
	"dnsproxi/upstream"
)

// maxAttempts bounds the attempts of one query: the first, and one retry
// or hedge.
const maxAttempts = 2

// The rcodes worth asking another upstream about.
const (
	rcodeServFail = 2
	rcodeRefused  = 5
)

// errInvalidReply ends an attempt whose reply Config.Valid refused.
var errInvalidReply = errors.New("pool: the reply's records cannot be read")

// Exchange is one query's way through the pool: its attempts, and the one
// report the caller gets. Acquire hands it out; Forward sends it; it
// returns to the pool by itself once the caller has its report and every
// attempt has reported.
//
// Exactly once, by construction: each attempt's Forwarder reports that
// attempt exactly once, and the attempt's report is where its breaker hears
// of it. The caller's report is made by whoever sets finished under mu —
// the attempt that brings a good answer, or the last one to end — and by no
// one else. The Exchange is recycled by whoever, under mu, finds the
// caller's report made and no attempt out: that happens once.
type Exchange struct {
	p  *Pool
	mu sync.Mutex
	// gen counts the Exchange's uses; a hedge names the use it is for, so
	// one due after its query ended, or after the Exchange was reused, does
	// nothing.
	gen uint64

	// Set by begin and Forward, read-only until the Exchange is recycled.
	query    []byte // a copy: retries and hedges send it again
	network  string
	deadline time.Time
	start    int               // where an extra attempt's scan starts (policy.go)
	done     upstream.Result   // the caller's report: this...
	doneAt   upstream.ResultAt // ...or this (ForwardAt)

	// Guarded by mu.
	tried    uint32 // a bit per upstream an attempt went to
	attempts int    // attempts sent or being set up
	out      int    // attempts whose report is awaited, one being set up included
	finished bool   // the caller's report is decided
	reported bool   // the caller's report has returned
	kept     []byte // a SERVFAIL or REFUSED answer, copied, in case nothing better comes
	hasKept  bool
	keptErr  error // the last error, for when no answer comes at all
	// The first attempt's word on the name, for an extra attempt's plain
	// timeout (settle): whether it has landed, and whether it vouches that
	// the name, not the upstreams, may be slow; held is the extra
	// attempt's permit while it waits for that word (holding).
	firstLanded, firstVouches, holding bool
	held                               guard.Permit

	att [maxAttempts]attempt
}

// attempt is one send of the query to one upstream. Its fields are written
// before the send and read by its report.
type attempt struct {
	member   int
	permit   guard.Permit
	sent     time.Time
	report   upstream.Result   // made once per Exchange, not once per query
	reportAt upstream.ResultAt // the same, from a ForwarderAt: it brings the clock reading
}

func newExchange(p *Pool) *Exchange {
	x := &Exchange{p: p}
	for i := range x.att {
		x.att[i].report = func(_, reply []byte, err error) { x.land(i, p.now(), reply, err) }
		x.att[i].reportAt = func(now time.Time, _, reply []byte, err error) { x.land(i, now, reply, err) }
	}
	return x
}

// begin readies x for a query whose first attempt goes to upstream i.
func (x *Exchange) begin(i int, permit guard.Permit, start int) {
	x.att[0].member, x.att[0].permit = i, permit
	x.start = start
	x.tried, x.attempts, x.out = 1<<i, 1, 1
	x.finished, x.reported, x.hasKept, x.keptErr = false, false, false, nil
	x.firstLanded, x.firstVouches, x.holding = false, false, false
}

// Forward sends query (one question) over network ("udp" or "tcp") to the
// upstream Acquire chose and reports the query's outcome to done, exactly
// once, by the deadline: the first good answer, else the last SERVFAIL or
// REFUSED answer, else the last error. query is copied; done's query is the
// copy. After done returns, x belongs to the pool again.
func (x *Exchange) Forward(query []byte, network string, done upstream.Result) {
	x.forward(x.p.now(), query, network, done, nil)
}

// ForwardAt is Forward for a caller that has just read the pool's clock:
// now, that reading, is when the query's deadline counts from, and done
// is told the pool's reading when the outcome was known (for a reply, the
// one its batch was read under), so that neither side reads the clock again.
func (x *Exchange) ForwardAt(now time.Time, query []byte, network string, done upstream.ResultAt) {
	x.forward(now, query, network, nil, done)
}

// forward is Forward and ForwardAt: exactly one of done and doneAt is set.
func (x *Exchange) forward(now time.Time, query []byte, network string, done upstream.Result, doneAt upstream.ResultAt) {
	p := x.p
	x.query = append(x.query[:0], query...)
	x.network, x.done, x.doneAt = network, done, doneAt
	x.deadline = now.Add(p.timeout)
	a := &x.att[0]
	a.sent = now
	if p.budget != nil {
		p.budget.DepositAt(now)
	}
	if p.hedger != nil {
		x.mu.Lock()
		gen := x.gen
		x.mu.Unlock()
		p.hedger.add(x, gen, now.Add(p.hedge))
	}
	x.send(a)
}

// send sends attempt a, sent at a.sent, to its upstream.
func (x *Exchange) send(a *attempt) {
	m := &x.p.members[a.member]
	if m.at != nil {
		m.at.ForwardAt(a.sent, x.query, x.network, x.deadline, a.reportAt)
		return
	}
	m.up.ForwardUntil(x.query, x.network, x.deadline, a.report)
}

// land is attempt i's report, known at now. It tells the attempt's
// breaker (an extra attempt's plain timeout waits for settle), then decides
// what the query does next: report, wait for the other attempt, or retry.
// Every breaker hears before the caller does.
func (x *Exchange) land(i int, now time.Time, reply []byte, err error) {
	p := x.p
	a := &x.att[i]
	v := upstream.Judge(reply, err)
	if v == upstream.Answer && p.valid != nil && !p.valid(x.query, reply) {
		v, reply, err = upstream.Failure, nil, errInvalidReply
	}
	plainTimeout := i > 0 && v == upstream.Failure && errors.Is(err, upstream.ErrTimeout)
	if !plainTimeout {
		mark(a.permit, v)
	}
	permit := a.permit
	a.permit = guard.Permit{}
	good, reason, worthRetry := judgeForQuery(v, reply)
	p.observe(a.member, v, good, err, now.Sub(a.sent))

	x.mu.Lock()
	x.out--
	s := x.settle(i, v, err, plainTimeout, permit)
	switch {
	case x.finished: // the query was answered by the other attempt
		free := x.reported && x.out == 0
		x.mu.Unlock()
		s.mark()
		if free {
			x.recycle()
		}
		return
	case good:
		x.finished = true
		x.mu.Unlock()
		s.mark()
		x.report(now, reply, nil)
		return
	case x.out > 0: // the other attempt is out: it decides
		x.keep(reply, err)
		x.mu.Unlock()
		s.mark()
		return
	case worthRetry && x.mayExtend(now):
		x.keep(reply, err)
		tried := x.reserve()
		x.mu.Unlock()
		s.mark()
		x.extend(reason, tried)
		return
	}
	x.finished = true
	x.mu.Unlock()
	s.mark()
	if reply != nil { // the latest SERVFAIL or REFUSED
		x.report(now, reply, nil)
		return
	}
	x.reportKept(now, err)
}

// settled is a breaker's verdict that settle decided under mu, told
// outside it: a breaker's change of state may run callbacks of its own.
type settled struct {
	permit guard.Permit
	v      upstream.Verdict
	ok     bool // false: nobody to tell (nearly always)
}

func (s *settled) mark() {
	if s.ok {
		mark(s.permit, s.v)
	}
}

// settle judges an extra attempt's plain timeout together with the first
// attempt. It requires that x.mu is held. Attempt i ended with v and err;
// plainTimeout says it is an extra attempt's timeout with no other reply
// from its upstream meanwhile (ErrTimeout), whose permit, given, its
// breaker has not heard of yet.
//
// An extra attempt goes only to a name the first upstream was slow on (a
// hedge) or did not answer usefully (a retry), and a backup under
// sequential sees nothing else: its timeouts have no neighbour to vouch
// for it. The first attempt vouches instead: if it answered (any rcode) or
// timed out as a slow name (ErrNameTimeout), the name may be the slow one,
// and the extra attempt's breaker hears nothing, so slow names hedged to an
// idle backup never open its breaker. If the first failed too (a network
// error, no valid reply, a plain timeout), both failures count, and two
// silent upstreams open both breakers. A hedge can time out before the
// first attempt has landed: its permit is held, and the first attempt's
// landing settles it. Both end by the same deadline, so that is a sweep at
// most, and the landing that settles is the last one out: every breaker
// still hears before the caller.
func (x *Exchange) settle(i int, v upstream.Verdict, err error, plainTimeout bool, permit guard.Permit) settled {
	if i == 0 {
		x.firstLanded = true
		x.firstVouches = v == upstream.Answer || errors.Is(err, upstream.ErrNameTimeout)
		if !x.holding {
			return settled{}
		}
		s := settled{x.held, x.extraVerdict(), true}
		x.held, x.holding = guard.Permit{}, false
		return s
	}
	switch {
	case !plainTimeout:
		return settled{}
	case !x.firstLanded:
		x.held, x.holding = permit, true
		return settled{}
	}
	return settled{permit, x.extraVerdict(), true}
}

// extraVerdict is the verdict on an extra attempt's plain timeout once the
// first attempt has landed (settle). It requires that x.mu is held.
func (x *Exchange) extraVerdict() upstream.Verdict {
	if x.firstVouches {
		return upstream.Uncounted
	}
	return upstream.Failure
}

// judgeForQuery says what an attempt's result is worth to the query: good
// (an answer to relay at once), or worth an extra attempt and why.
func judgeForQuery(v upstream.Verdict, reply []byte) (good bool, why Reason, worthRetry bool) {
	switch v {
	case upstream.Answer:
		if rc := reply[3] & 0x0f; rc == rcodeServFail || rc == rcodeRefused {
			return false, RetryAnswer, true
		}
		return true, 0, false
	case upstream.Failure: // a timeout too; mayExtend finds no time left for it
		return false, RetryFailure, true
	}
	return false, 0, false
}

// mayExtend reports whether an extra attempt may be set up now: none was
// yet, the pool has a budget and another upstream, and at least minLeft of
// the deadline is left. It requires that x.mu is held.
func (x *Exchange) mayExtend(now time.Time) bool {
	return x.attempts < maxAttempts && x.p.budget != nil && len(x.p.members) > 1 &&
		x.deadline.Sub(now) >= x.p.minLeft
}

// reserve counts an extra attempt as sent and out before it is set up, so
// that no one reports or recycles the query meanwhile. It requires that
// x.mu is held, and returns the upstreams tried so far.
func (x *Exchange) reserve() uint32 {
	x.attempts++
	x.out++
	return x.tried
}

// keep remembers a result that is not good, in case nothing better comes:
// an answer (copied: reply is lent only until the report returns) over an
// error. It requires that x.mu is held.
func (x *Exchange) keep(reply []byte, err error) {
	if reply != nil {
		x.kept = append(x.kept[:0], reply...)
		x.hasKept = true
		return
	}
	x.keptErr = err
}

// extend sets up and sends the extra attempt reserved for reason: the next
// upstream the policy gives, if its breaker admits, the budget allows and
// the outbound limit has a token. If not, the reservation is given back,
// and if nothing else is out the query is reported with what it has.
//
// The outbound token is asked last, so that a token is taken only for an
// attempt about to be sent; a budget withdrawal it then refuses is not
// given back. If the query is answered while the attempt is being set up,
// the attempt is not sent and its token and withdrawal are spent: the
// upstreams see fewer attempts than were paid for, never more
// (TestFirstAttemptEndsWhileTheHedgeIsSetUp).
func (x *Exchange) extend(reason Reason, tried uint32) {
	p := x.p
	i, permit, ok := p.choose(x.start, tried)
	if ok && !p.budget.Withdraw() {
		permit.Cancel()
		permit, ok = guard.Permit{}, false
		if p.obs != nil {
			p.obs.BudgetExhausted()
		}
	}
	if ok && !p.allowOutbound() {
		permit.Cancel()
		permit, ok = guard.Permit{}, false
	}
	x.mu.Lock()
	if !ok || x.finished {
		permit.Cancel() // the zero Permit, or one taken while the other attempt answered
		x.attempts--
		x.out--
		if !x.finished && x.out == 0 {
			x.finished = true
			x.mu.Unlock()
			x.reportKept(time.Time{}, nil)
			return
		}
		free := x.finished && x.reported && x.out == 0
		x.mu.Unlock()
		if free {
			x.recycle()
		}
		return
	}
	a := &x.att[x.attempts-1]
	a.member, a.permit, a.sent = i, permit, p.now()
	x.tried |= 1 << i
	x.mu.Unlock()
	if p.obs != nil {
		p.obs.Retry(reason)
	}
	x.send(a)
}

// hedge is the hedge of use gen coming due at due, sent at now: if that
// query is still waiting for its first attempt alone, the extra attempt
// goes out. The time left is judged at due, not now: the hedger always
// wakes a little after due, and a hedge the configuration allows (due
// leaves minLeft, New sees to it) is not lost to that. One the hedger
// reaches only after the deadline (a stalled process) is not sent, and is
// counted (LateHedges): its upstream could not answer in time, and its
// timeout would be judged against it.
func (x *Exchange) hedge(gen uint64, due, now time.Time) {
	x.mu.Lock()
	if x.gen != gen || x.finished || !x.mayExtend(due) {
		x.mu.Unlock()
		return
	}
	if !now.Before(x.deadline) {
		x.mu.Unlock()
		x.p.lateHedges.Add(1)
		return
	}
	tried := x.reserve()
	x.mu.Unlock()
	x.extend(RetryHedge, tried)
}

// reportKept reports the best result kept: an answer if one came, else
// the last error (err if it is the latest), as report does at now. An
// attempt that never left the process (upstream.NotSent) gives way to an
// error kept from one that did: the upstream that was asked failed, and a
// caller reading the error must not take it for one never asked.
func (x *Exchange) reportKept(now time.Time, err error) {
	if x.hasKept {
		x.report(now, x.kept, nil)
		return
	}
	if err == nil || x.keptErr != nil && upstream.NotSent(err) {
		err = x.keptErr
	}
	if err == nil {
		err = upstream.ErrTimeout // no attempt could be sent or ended: cannot happen, but never report nothing
	}
	x.report(now, nil, err)
}

// report gives the query's outcome, known at now (zero: the clock is read
// if the caller asked for the reading), to the caller: the one report.
func (x *Exchange) report(now time.Time, reply []byte, err error) {
	if x.doneAt != nil {
		if now.IsZero() {
			now = x.p.now()
		}
		x.doneAt(now, x.query, reply, err)
	} else {
		x.done(x.query, reply, err)
	}
	x.mu.Lock()
	x.reported = true
	free := x.out == 0
	x.mu.Unlock()
	if free {
		x.recycle()
	}
}

// Cancel gives back an Exchange Acquire returned that will not forward:
// its first attempt's breaker hears nothing (a half-open probe's place is
// freed at once), and x belongs to the pool again. The outbound token
// Acquire paid is not given back.
func (x *Exchange) Cancel() {
	x.att[0].permit.Cancel()
	x.recycle()
}

// maxKept is the largest kept answer buffer an Exchange takes back into
// the pool: a SERVFAIL over TCP may be 64 KiB, and kept, every pooled
// Exchange would grow to the largest answer it ever saw.
const maxKept = 8192

// recycle returns x to the pool; a hedge still queued for this use finds
// another gen.
func (x *Exchange) recycle() {
	x.mu.Lock()
	x.gen++
	x.mu.Unlock()
	x.done, x.doneAt, x.keptErr = nil, nil, nil
	if cap(x.kept) > maxKept {
		x.kept = nil // one large answer must not make this Exchange large for good
	}
	x.held = guard.Permit{} // settled by the first attempt's landing: never left here
	for i := range x.att {
		x.att[i].permit = guard.Permit{}
	}
	x.p.exchanges.Put(x)
}
