package main

import (
	"strconv"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
	"dnsproxi/internal/wire"
)

// An upstream (or a middlebox on its path) that truncates a UDP answer at
// the byte, sets TC and leaves the header's counts as they were, sends a
// reply that validates (ID, QR, question) and says exactly one thing: ask
// again over TCP. It must reach the client as TC (the proxy answered
// SERVFAIL, so the client never retried over TCP) and count as an answer
// (the breaker counted a failure, so a client asking large names through
// such an upstream opened it for everyone).
func TestByteTruncatedTCAnswerIsRelayedAsTC(t *testing.T) {
	fwd := &scripted{reply: func(req *dns.Msg) []byte {
		m := answerMsg(req)
		b, _ := m.Pack()
		b = b[:512] // cut mid-record, counts left as they were
		wire.SetFlags(b, wire.Flags(b)|wire.FlagTC)
		return b
	}}
	pr, srv := unitProxy(nil, fwd)
	clock := guard.NewManualClock(time.Now())
	b := guard.NewBreaker(guard.BreakerConfig{Window: 4, MinSamples: 4, FailThreshold: 0.5, CoolOff: time.Minute}, clock)
	pr.upstreams = onePool(fwd, b)

	servfail := 0
	for i := range 4 {
		q := ednsQuery("big.example.com", dns.TypeA, 1232, false)
		q.Id = uint16(i)
		if r, _ := serveMsg(t, srv, q); r == nil || r.Rcode != dns.RcodeSuccess || !r.Truncated {
			servfail++
		}
	}
	if st := b.State(); servfail > 0 || st != guard.Closed {
		t.Fatalf("4 valid TC answers from the upstream: %d clients got no TC answer (SERVFAIL: no TCP retry), and the breaker is %v",
			servfail, st)
	}
}

// answerMsg is the fake upstream's answer to req with 40 more A records:
// about 700 bytes.
func answerMsg(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	m.RecursionAvailable = true
	for i := range 41 {
		rr, _ := dns.NewRR(req.Question[0].Name + " 60 IN A 192.0.2." + strconv.Itoa(i+1))
		m.Answer = append(m.Answer, rr)
	}
	return m
}
