package main

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
	"dnsproxi/metrics"
)

// exchanger is the upstream as handleQuery sees it.
type exchanger interface {
	Exchange(ctx context.Context, req *dns.Msg, network string) (*dns.Msg, error)
}

// proxy answers queries by forwarding them through the two gates.
type proxy struct {
	limiter     *guard.TokenBucket // entry gate; nil: off
	breaker     *guard.Breaker     // forward gate; nil: off
	maxInflight int64              // cap on exchanges in flight; 0: none
	inflight    atomic.Int64
	upstream    exchanger
	metrics     *metrics.Metrics
}

// handleQuery answers one query and counts how it ended.
func (p *proxy) handleQuery(w dns.ResponseWriter, r *dns.Msg) {
	start := time.Now()
	qtype := metrics.OtherQType
	if len(r.Question) > 0 {
		qtype = p.metrics.QType(r.Question[0].Qtype)
	}
	outcome := p.answer(w, r)
	p.metrics.Count(qtype, outcome)
	p.metrics.RequestDuration.Observe(time.Since(start).Seconds())
}

// answer runs the query through the gates and the upstream, writes the
// answer if there is one, and returns the outcome.
func (p *proxy) answer(w dns.ResponseWriter, r *dns.Msg) string {
	// 1. Entry gate: beyond the rate, drop. Every query pays, well-formed or not.
	if p.limiter != nil && !p.limiter.Allow(1) {
		return metrics.RateLimited
	}
	if r.Opcode != dns.OpcodeQuery {
		reply(w, r, dns.RcodeNotImplemented)
		return metrics.NotImp
	}
	if len(r.Question) != 1 {
		reply(w, r, dns.RcodeFormatError)
		return metrics.FormErr
	}

	// Concurrency cap: beyond it, REFUSED at once; never queue, never wait.
	// It comes before the forward gate so that a refusal cannot take the
	// half-open probe's place.
	if !p.enter() {
		reply(w, r, dns.RcodeRefused)
		return metrics.Overloaded
	}
	defer p.leave()

	// 2. Forward gate: an open breaker answers SERVFAIL at once.
	var permit guard.Permit // the zero Permit reports nowhere: the gate is off
	if p.breaker != nil {
		var err error
		if permit, err = p.breaker.Acquire(); err != nil {
			reply(w, r, dns.RcodeServerFailure)
			return metrics.BreakerOpen
		}
	}
	// From here on, every path reports to the breaker exactly once.
	sent := false
	markBreaker := func(ok bool) {
		if sent {
			return
		}
		sent = true
		if ok {
			permit.Success()
		} else {
			permit.Failure()
		}
	}
	defer markBreaker(false) // a path that forgot, or a panic, counts as a failure

	// 3. Exchange with the upstream.
	start := time.Now()
	resp, err := p.upstream.Exchange(context.Background(), r, network(w))
	p.metrics.UpstreamDuration.Observe(time.Since(start).Seconds())
	if err != nil {
		markBreaker(false)
		reply(w, r, dns.RcodeServerFailure)
		return metrics.UpstreamError
	}
	markBreaker(true) // any well-formed answer, NXDOMAIN and SERVFAIL included
	if network(w) == "udp" {
		resp.Truncate(clientUDPSize(r))
	}
	w.WriteMsg(resp)
	return metrics.Forwarded
}

// enter takes a place among the exchanges in flight, if the cap allows.
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

// reply answers r with rcode and r's question.
func reply(w dns.ResponseWriter, r *dns.Msg, rcode int) {
	m := new(dns.Msg)
	m.SetRcode(r, rcode)
	m.RecursionAvailable = true
	w.WriteMsg(m)
}

// network tells whether the client came over "udp" or "tcp".
func network(w dns.ResponseWriter) string {
	if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
		return "tcp"
	}
	return "udp"
}

// clientUDPSize is the largest UDP answer the client accepts: its EDNS
// buffer size, or 512 without EDNS (RFC 1035, RFC 6891).
func clientUDPSize(r *dns.Msg) int {
	if opt := r.IsEdns0(); opt != nil {
		return max(dns.MinMsgSize, int(opt.UDPSize()))
	}
	return dns.MinMsgSize
}
