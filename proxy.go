package main

import (
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/dnsserver"
	"dnsproxi/guard"
	"dnsproxi/internal/wire"
	"dnsproxi/metrics"
	"dnsproxi/upstream"
)

// forwarder is the upstream as handleQuery sees it: it reports the outcome
// of every query it is given exactly once, to done.
type forwarder interface {
	Forward(query []byte, network string, done upstream.Result)
}

// proxy answers queries by forwarding them through the two gates.
type proxy struct {
	limiter     *guard.TokenBucket // entry gate; nil: off
	breaker     *guard.Breaker     // forward gate; nil: off
	maxInflight int64              // cap on queries at the upstream; 0: none
	inflight    atomic.Int64
	upstream    forwarder
	metrics     *metrics.Metrics
}

// handleQuery runs one query through the entry gate and the forward gate to
// the upstream. It never waits: the upstream reports back later, exactly
// once, and that report is what tells the breaker how the call went.
func (p *proxy) handleQuery(w dnsserver.ResponseWriter, q *dnsserver.Query) {
	start := time.Now()
	qtype := p.metrics.QType(q.QType)

	// 1. Entry gate: beyond the rate, drop. Every query pays, well-formed or not.
	if p.limiter != nil && !p.limiter.Allow(1) {
		w.Drop()
		p.count(qtype, metrics.RateLimited, start)
		return
	}
	if q.Opcode != dns.OpcodeQuery {
		p.reply(w, q.Wire, q.QEnd, dns.RcodeNotImplemented, qtype, metrics.NotImp, start)
		return
	}
	if q.QDCount != 1 {
		p.reply(w, q.Wire, wire.HeaderLen, dns.RcodeFormatError, metrics.OtherRow, metrics.FormErr, start)
		return
	}
	// The cap on queries at the upstream: beyond it, REFUSED at once; never
	// queue. It comes before the forward gate so that a refusal cannot take
	// the half-open probe's place.
	if !p.enter() {
		p.reply(w, q.Wire, q.QEnd, dns.RcodeRefused, qtype, metrics.Overloaded, start)
		return
	}

	// 2. Forward gate: an open breaker answers SERVFAIL at once.
	var permit guard.Permit // the zero Permit reports nowhere: the gate is off
	if p.breaker != nil {
		var err error
		if permit, err = p.breaker.Acquire(); err != nil {
			p.leave()
			p.reply(w, q.Wire, q.QEnd, dns.RcodeServerFailure, qtype, metrics.BreakerOpen, start)
			return
		}
	}

	// 3. Exchange. Whatever happens to the query (an answer, a timeout, a
	// network error, shutdown), this runs exactly once, so every permit the
	// breaker handed out is ended exactly once.
	udpSize := 0
	if q.Net == "udp" {
		udpSize = q.UDPSize
	}
	p.upstream.Forward(q.Wire, q.Net, func(query, reply []byte, err error) {
		p.leave()
		p.metrics.UpstreamDuration.Observe(time.Since(start).Seconds())
		markBreaker(permit, upstream.Judge(reply, err))
		if err != nil { // any error, a slow name's timeout too: the client gets SERVFAIL
			qend, ok := wire.QuestionEnd(query)
			if !ok {
				qend = wire.HeaderLen // cannot happen for a query the server parsed; answer without a question
			}
			p.reply(w, query, qend, dns.RcodeServerFailure, qtype, metrics.UpstreamError, start)
			return
		}
		w.Write(truncate(reply, udpSize))
		p.count(qtype, metrics.Forwarded, start)
	})
}

// markBreaker ends the breaker's permit with what the exchange says about the
// upstream: an answer (SERVFAIL included) is a success, a failure a failure;
// shutdown or a slow name's timeout is neither, and a probe's place is freed.
func markBreaker(permit guard.Permit, v upstream.Verdict) {
	switch v {
	case upstream.Answer:
		permit.Success()
	case upstream.Failure:
		permit.Failure()
	default:
		permit.Cancel()
	}
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

// reply answers query (whose question ends at qend) with rcode and no
// records, and counts the outcome.
func (p *proxy) reply(w dnsserver.ResponseWriter, query []byte, qend, rcode int, qtype metrics.QTypeRow, o metrics.Outcome, start time.Time) {
	var buf [wire.HeaderLen + 260]byte // a header and the longest question: no allocation
	w.Write(wire.AppendReply(buf[:0], query, qend, rcode))
	p.count(qtype, o, start)
}

func (p *proxy) count(qtype metrics.QTypeRow, o metrics.Outcome, start time.Time) {
	p.metrics.Count(qtype, o)
	p.metrics.RequestDuration.Observe(time.Since(start).Seconds())
}

// truncate makes a UDP answer fit the client's size (0: TCP, no limit). An
// answer that fits, nearly all of them, is returned as it is; one that does
// not is unpacked and cut to what fits, with TC set.
func truncate(reply []byte, size int) []byte {
	if size == 0 || len(reply) <= size {
		return reply
	}
	m := new(dns.Msg)
	if m.Unpack(reply) == nil {
		m.Truncate(size)
		if b, err := m.Pack(); err == nil && len(b) <= size {
			return b
		}
	}
	// An answer that will not parse or shrink: its header and question, TC set.
	qend, ok := wire.QuestionEnd(reply)
	if !ok {
		qend = wire.HeaderLen
	}
	b := wire.AppendReply(nil, reply, qend, int(wire.Flags(reply)&0xF))
	wire.SetFlags(b, wire.Flags(b)|wire.FlagTC)
	return b
}
