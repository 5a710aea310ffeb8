package main

import (
	"errors"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/dnsserver"
	"dnsproxi/guard"
	"dnsproxi/internal/wire"
	"dnsproxi/metrics"
	"dnsproxi/pool"
)

// proxy answers queries by forwarding them through the gates. Its zero
// fields are off or take their defaults.
type proxy struct {
	access      *guard.AccessList  // who may ask; nil: anyone (DNS_ALLOW=any)
	denied      *guard.TokenBucket // REFUSED answers to denied UDP queries; nil: no bound
	clients     *clientGates       // entry gate per client prefix, a table per transport; nil: off
	limiter     *guard.TokenBucket // entry gate; nil: off
	action      LimitAction        // what a UDP query refused by an entry gate gets
	slips       atomic.Uint64      // UDP queries refused under slip, to answer every Nth
	maxInflight int64              // cap on queries at the upstreams; 0: none
	maxUDPSize  int                // largest UDP answer, and the size advertised upstream; 0: 1232
	inflight    atomic.Int64
	followerCap int64        // bound on the queries waiting on others' flights (coalesce.go); 0: none
	followers   atomic.Int64 // the queries waiting on others' flights now
	upstreams   *pool.Pool   // forward gate (a breaker per upstream) and exchange
	metrics     *metrics.Metrics
	flights     [2]flightTable // queries at the upstream that others may join: UDP, TCP
	// landing, if set (tests only), runs in land between a flight's two
	// hand-overs: its answer into the cache and the flight out of the table.
	landing     atomic.Pointer[func()]
	upstreamRA  atomic.Uint32 // raUnseen, raWith or raWithout
	qlog        *queryLog     // one line per query; nil: off
	upstreamFor string        // the upstream named in the query log
	cache       *answerCache  // the answer cache (cached.go, stale.go); nil: off
	clock       guard.Clock   // what the entry gates and the cache were built on; nil: the real clock
}

// handleQuery runs one query through the entry gate and the forward gate to
// the upstream. It never waits: the upstream reports back later, exactly
// once, and that report is what tells the breaker how the call went.
func (p *proxy) handleQuery(w dnsserver.ResponseWriter, q *dnsserver.Query) {
	start := time.Now()
	now := p.now(start) // the one reading the entry gates and the cache share
	qtype := p.metrics.QType(q.QType)
	if q.Malformed || q.QDCount != 1 {
		qtype = metrics.OtherRow
	}

	// 0. Access: a client outside DNS_ALLOW is REFUSED before it can spend
	// anyone's tokens. Over UDP its address may be forged, so those answers
	// have a small bucket of their own and beyond it are dropped: a spoofed
	// flood can make the proxy reflect a few small answers a second, no more.
	if p.access != nil && !p.access.Contains(q.Client.Addr()) {
		rcode := noAnswer
		if q.Net == "tcp" || p.denied == nil || p.denied.Allow(1) {
			p.own(w, q, dns.RcodeRefused, edeDenied)
			rcode = dns.RcodeRefused
		} else {
			w.Drop()
		}
		p.count(qtype, metrics.Denied, start, q, rcode)
		return
	}

	// 1. Entry gates: the client's own bucket first (one table for UDP,
	// where addresses can be forged, one for TCP: access.go), so a
	// flooder's excess never drains the bucket everyone shares; then the
	// shared one, whose refusal costs the client's bucket nothing (a token
	// of each, or none: guard/clientshared.go). Beyond either, a UDP query
	// gets what DNS_LIMIT_ACTION says (limits.go); a TCP query, whose
	// source the handshake proved, REFUSED. Every query pays, well-formed
	// or not.
	switch p.entryGates(q, now) {
	case guard.RefusedByClient:
		p.count(qtype, metrics.ClientLimited, start, q, p.limited(w, q, edeClientLimit))
		return
	case guard.RefusedByShared:
		p.count(qtype, metrics.RateLimited, start, q, p.limited(w, q, edeRateLimit))
		return
	}
	// The answers below carry an OPT to a client that sent one but no
	// Extended DNS Error: no bucket bounds them, and with an EDE's text each
	// would be up to 2.3 times the query that drew it, a reflector for a
	// forged source inside DNS_ALLOW (TestOwnErrorAnswersDoNotAmplify).
	switch {
	case q.Malformed:
		p.refuse(w, q, dns.RcodeFormatError, nil, qtype, metrics.FormErr, start)
		return
	case q.Opcode != dns.OpcodeQuery:
		p.refuse(w, q, dns.RcodeNotImplemented, nil, qtype, metrics.NotImp, start)
		return
	case q.QDCount != 1:
		p.refuse(w, q, dns.RcodeFormatError, nil, qtype, metrics.FormErr, start)
		return
	case q.EDNS.Version > 0: // RFC 6891 §6.1.3: the proxy speaks version 0
		p.refuse(w, q, dns.RcodeBadVers, nil, qtype, metrics.FormErr, start)
		return
	case q.Signed:
		// A TSIG or SIG(0) signs the client's hop with a key the proxy
		// does not hold, and what goes upstream is rewritten (ID, case,
		// OPT): forwarded, it would go unsigned and its answer come back
		// unsigned, from the upstream's view for unsigned queries. A
		// forwarder must not change a signed message (RFC 8945 §5.5), and
		// this kind of query is one the proxy does not implement.
		p.refuse(w, q, dns.RcodeNotImplemented, nil, qtype, metrics.NotImp, start)
		return
	case q.QType == dns.TypeAXFR || q.QType == dns.TypeIXFR: // relayed over UDP they would be cut
		p.refuse(w, q, dns.RcodeRefused, nil, qtype, metrics.TransferRefused, start)
		return
	}

	// 2. Cache, then coalescing: a fresh answer is written at once, touching
	// neither the cap nor the breaker (cached.go). Else the same query
	// already at the upstream, and room to wait for it: wait, paying neither
	// the cap nor the breaker (coalesce.go).
	f, coalesce := p.newFlight(w, q, qtype, start)
	if p.fromCache(f, coalesce, now) {
		return
	}
	if coalesce {
		switch p.join(f) {
		case joined:
			return
		case overloaded: // as many wait on flights as the proxy lets wait
			if p.refusedFromCache(f) { // stale if cached (stale.go)
				return
			}
			f.recycle()
			p.refuse(w, q, dns.RcodeRefused, edeOverloaded, qtype, metrics.Overloaded, start)
			return
		}
	}

	// 3. The cap on queries at the upstream: beyond it, REFUSED at once;
	// never queue. It comes before the forward gate so that a refusal cannot
	// take the half-open probe's place.
	if !p.enter() {
		if p.refusedFromCache(f) { // stale if cached (stale.go)
			return
		}
		f.recycle()
		p.refuse(w, q, dns.RcodeRefused, edeOverloaded, qtype, metrics.Overloaded, start)
		return
	}

	// 4. Forward gate: the upstream the policy gives among those whose
	// breaker admits; when every breaker refuses, stale if cached, else
	// SERVFAIL at once.
	x, err := p.upstreams.Acquire()
	if errors.Is(err, pool.ErrLimited) {
		// 4b. Outbound limit (DNS_UPSTREAM_RATE_LIMIT, this instance's or
		// the fleet's): a breaker admitted the query, but the upstreams'
		// quota has no token for its first attempt: stale if cached, else
		// REFUSED at once.
		p.leave()
		if p.refusedFromCache(f) { // stale if cached (stale.go)
			return
		}
		f.recycle()
		p.refuse(w, q, dns.RcodeRefused, edeOutbound, qtype, metrics.UpstreamLimited, start)
		return
	}
	if err != nil {
		p.leave()
		if p.refusedFromCache(f) { // stale if cached (stale.go)
			return
		}
		f.recycle()
		p.refuse(w, q, dns.RcodeServerFailure, edeBreakerOpen, qtype, metrics.BreakerOpen, start)
		return
	}

	// 5. Exchange, under the proxy's own OPT, within one deadline: a retry
	// or a hedge at another upstream included (pool/). Each attempt tells
	// its own breaker how it went; whatever happens to the query (an
	// answer, a timeout, a network error, shutdown), f.land runs exactly once.
	if coalesce && p.joinOrShare(f) == joined { // an identical query started a flight since step 2
		p.leave()
		x.Cancel()
		return
	}
	f.query = p.appendUpstreamQuery(f.query[:0], q)
	p.armStaleWait(f) // an expired entry's refresh: stale after DNS_CACHE_STALE_WAIT (stale.go)
	// The pool is on the real clock, as start is: the query's deadline counts
	// from the moment it was read, and the pool and the upstream read the
	// clock no more for it.
	net := q.Net
	if f.cached.overTCP {
		net = "tcp" // a refresh of an answer too large for UDP (cached.go)
	}
	x.ForwardAt(start, f.query, net, f.done)
}

// land is a flight's completion, known at now: it answers every waiter,
// each with its own answer. The query leaves DNS_MAX_INFLIGHT here, even
// while an attempt it no longer needs is still out.
func (f *flight) land(now time.Time, _, reply []byte, err error) {
	p := f.p
	p.leave()
	ua, ok := upstreamAnswer{}, false
	if err == nil && reply != nil {
		ua, ok = readUpstreamAnswer(reply, f.lead.question()) // validReply let it through: ok
	}
	if ok {
		p.noteRA(ua.flags)
	}
	// The cache (stale.go): store the answer or note the failed refresh,
	// before f leaves the table, so that a query that comes meanwhile finds
	// one or the other: it joins f, or it is answered from the cache.
	stale := p.settleCache(f, reply, usableAnswer(&ua, ok), err)
	if h := p.landing.Load(); h != nil {
		(*h)()
	}
	if f.shared {
		p.unshare(f) // from here on no one joins: f's waiters are ours to read
	}
	// Leave the waiters if the stale-wait timer has answered them.
	if !f.claimWaiters() {
		return
	}
	var failed upstreamFailure
	if !ok {
		failed = failureOf(err)
	}
	bp := getBuf()
	b := *bp
	for i := range f.waiting() {
		wt := f.waiter(i)
		switch {
		case wt.w == nil: // a prefetch: its client had its answer from the cache
			continue
		case stale:
			p.writeCached(wt, f.cached.fallback, metrics.Stale)
			continue
		}
		if ok {
			b = ua.appendFor(b[:0], wt, p.udpSize())
			wt.w.Write(b)
			p.recordTook(wt.qtype, metrics.Forwarded, wt.start, took(now, wt.start), wt.client, wt.question(), ua.rcodeFor(b, wt), p.upstreamFor)
			continue
		}
		// A failure, or a reply whose records cannot be walked: SERVFAIL
		// (REFUSED when the outbound limit stopped a re-send).
		b = p.appendOwn(b[:0], wt.id, wt.flags, wt.question(), wt.edns, wt.do, failed.rcode, failed.ede)
		wt.w.Write(b)
		p.recordTook(wt.qtype, failed.outcome, wt.start, took(now, wt.start), wt.client, wt.question(), failed.rcode, p.upstreamFor)
	}
	putBuf(bp, b)
	p.releaseFollowers(f)
	f.recycle()
}

// took is how long a waiter that came in at start waited for an outcome
// known at now: never less than 0, for one that joined its flight after
// the reply was read and before the flight left the table.
func took(now, start time.Time) time.Duration { return max(now.Sub(start), 0) }

// appendUpstreamQuery appends the query sent upstream for q: q's question
// (upstream randomises its case and restores it) and RD and CD, AD set to
// learn what the upstream validated, and the proxy's own OPT record if q
// had one — its size, q's DO, no options: cookies, NSID, padding and the
// like belong to the client's hop. The upstream gives it a fresh ID.
func (p *proxy) appendUpstreamQuery(dst []byte, q *dnsserver.Query) []byte {
	flags := wire.Flags(q.Wire)&(wire.FlagRD|wire.FlagCD) | wire.FlagAD
	dst = appendHeader(dst, wire.ID(q.Wire), flags, 0, 0, 0, q.EDNS.Present)
	dst = append(dst, q.Wire[wire.HeaderLen:q.QEnd]...)
	if q.EDNS.Present {
		dst = wire.AppendOPT(dst, p.udpSize(), 0, q.EDNS.DO, nil)
	}
	return dst
}

// validReply reports whether reply, which answers query (as upstream
// validated it), has records the proxy can relay: a reply that does not is
// no valid reply, a failure for the breakers and the retries alike.
func validReply(query, reply []byte) bool {
	qend, ok := wire.QuestionEnd(query)
	if !ok {
		return false
	}
	_, ok = readUpstreamAnswer(reply, query[wire.HeaderLen:qend])
	return ok
}

// now returns the clock reading a query's entry gates and cache lookup
// share: on the real clock, start itself. A hit is short and time.Now is
// not (60–200 ns on a VM): one reading per query instead of one per gate.
func (p *proxy) now(start time.Time) time.Time {
	if p.clock == nil {
		return start
	}
	return p.clock.Now()
}

// enter takes a place among the queries at the upstream, if the cap allows.
func (p *proxy) enter() bool {
	n := p.inflight.Add(1)
	if p.maxInflight > 0 && n > p.maxInflight {
		p.inflight.Add(-1)
		return false
	}
	p.metrics.InFlight.Inc()
	return true
}

func (p *proxy) leave() {
	p.inflight.Add(-1)
	p.metrics.InFlight.Dec()
}

// refuse answers q with the proxy's own answer, rcode and e, and counts
// outcome o.
func (p *proxy) refuse(w dnsserver.ResponseWriter, q *dnsserver.Query, rcode int, e *ede, qtype metrics.QTypeRow, o metrics.Outcome, start time.Time) {
	p.own(w, q, rcode, e)
	p.count(qtype, o, start, q, rcode)
}

// own answers q with the proxy's own answer, rcode: its question if it was
// read, an OPT record if it sent one, with e as its Extended DNS Error.
func (p *proxy) own(w dnsserver.ResponseWriter, q *dnsserver.Query, rcode int, e *ede) {
	bp := getBuf()
	b := p.appendOwn((*bp)[:0], wire.ID(q.Wire), wire.Flags(q.Wire), q.Wire[wire.HeaderLen:q.QEnd], q.EDNS.Present, q.EDNS.DO, rcode, e)
	w.Write(b)
	putBuf(bp, b)
}

// refuseUnanswered answers a TCP query the server turns away because it
// holds too many unanswered (dnsserver.Server.MaxUnanswered): REFUSED, as
// the proxy's own answers are built (its OPT, EDE and RA). The server
// counts it (dropped "overloaded").
func (p *proxy) refuseUnanswered(w dnsserver.ResponseWriter, q *dnsserver.Query) {
	e := edeOverloaded
	if p.access != nil && !p.access.Contains(q.Client.Addr()) {
		e = edeDenied // an outsider learns nothing of the load (TestUnansweredBoundRefusalOfAnOutsiderIsProhibited)
	}
	p.own(w, q, dns.RcodeRefused, e)
}

// count counts q, answered by the proxy itself with rcode (noAnswer:
// dropped), under outcome o.
func (p *proxy) count(qtype metrics.QTypeRow, o metrics.Outcome, start time.Time, q *dnsserver.Query, rcode int) {
	p.record(qtype, o, start, q.Client, q.Wire[wire.HeaderLen:q.QEnd], rcode, "")
}

// record counts one query under outcome o and, with the query log on, logs
// it: its client, question, rcode and the upstream that answered ("" if none).
func (p *proxy) record(qtype metrics.QTypeRow, o metrics.Outcome, start time.Time, client netip.AddrPort, question []byte, rcode int, upstream string) {
	p.recordTook(qtype, o, start, time.Since(start), client, question, rcode, upstream)
}

// recordTook is record for a query whose answer took d since start.
func (p *proxy) recordTook(qtype metrics.QTypeRow, o metrics.Outcome, start time.Time, d time.Duration, client netip.AddrPort, question []byte, rcode int, upstream string) {
	p.metrics.Count(qtype, o)
	p.metrics.RequestDuration.Observe(d.Seconds())
	if p.qlog != nil {
		p.qlog.add(start, d, client, question, o, rcode, upstream)
	}
}
