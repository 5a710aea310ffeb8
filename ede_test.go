package main

import (
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
	"dnsproxi/internal/wire"
	"dnsproxi/upstream"
)

// failing is a forwarder that ends every query with err at once.
type failing struct{ err error }

func (f failing) Forward(query []byte, _ string, done upstream.Result) { done(query, nil, f.err) }

// garbled answers every query with a reply whose records cannot be read.
type garbled struct{}

func (garbled) Forward(query []byte, _ string, done upstream.Result) {
	qend, _ := wire.QuestionEnd(query)
	r := append([]byte(nil), query[:qend]...)
	r[2] |= 0x80                  // QR
	wire.SetCounts(r, 1, 1, 0, 0) // one answer record, which is not there
	done(query, append(r, 0xC0), nil)
}

// The proxy's own answers carry an Extended DNS Error (RFC 8914) exactly
// when the client sent EDNS, with the code of what went wrong, and still
// fit the client's size.
func TestOwnAnswersCarryEDE(t *testing.T) {
	tripped := func() *guard.Breaker {
		b := guard.NewBreaker(guard.BreakerConfig{Window: 1, MinSamples: 1, FailThreshold: 0.5, CoolOff: time.Hour}, guard.NewManualClock(time.Now()))
		p, _ := b.Acquire()
		p.Failure()
		return b
	}
	tests := []struct {
		name  string
		setup func(p *proxy)
		fwd   forwarder
		rcode int
		code  uint16
	}{
		{"breaker open", func(p *proxy) { p.upstreams = onePool(&scripted{reply: zone(nil)}, tripped()) }, &scripted{reply: zone(nil)}, dns.RcodeServerFailure, dns.ExtendedErrorCodeNoReachableAuthority},
		{"upstream timeout", nil, failing{upstream.ErrTimeout}, dns.RcodeServerFailure, dns.ExtendedErrorCodeNoReachableAuthority},
		{"network error", nil, failing{syscall.ECONNREFUSED}, dns.RcodeServerFailure, dns.ExtendedErrorCodeNetworkError},
		{"no valid reply", nil, garbled{}, dns.RcodeServerFailure, dns.ExtendedErrorCodeNetworkError},
		{"overloaded", func(p *proxy) { p.maxInflight = 1; p.inflight.Store(1) }, &scripted{reply: zone(nil)}, dns.RcodeRefused, dns.ExtendedErrorCodeOther},
		{"upstream limited", func(p *proxy) { p.upstreams = limitedPool(&scripted{reply: zone(nil)}) }, &scripted{reply: zone(nil)}, dns.RcodeRefused, dns.ExtendedErrorCodeOther},
	}
	long := strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 55) + "."
	for _, tt := range tests {
		for _, edns := range []bool{true, false} {
			name := tt.name + " without EDNS"
			if edns {
				name = tt.name + " with EDNS"
			}
			t.Run(name, func(t *testing.T) {
				p, srv := unitProxy(nil, tt.fwd)
				if tt.setup != nil {
					tt.setup(p)
				}
				for _, qname := range []string{"www.example.com", long} {
					q := query(qname, dns.TypeA)
					if edns {
						q.SetEdns0(512, false)
					}
					r, raw := serveMsg(t, srv, q)
					if r == nil || r.Rcode != tt.rcode {
						t.Fatalf("%s: answer %v, want %s", qname, r, dns.RcodeToString[tt.rcode])
					}
					if len(raw) > 512 {
						t.Fatalf("%s: a %d-byte answer for a client that takes 512", qname, len(raw))
					}
					e, has := edeOf(r)
					if has != edns {
						t.Fatalf("%s: EDE present %v, want %v (the client sent EDNS: %v)", qname, has, edns, edns)
					}
					if edns && e.InfoCode != tt.code {
						t.Fatalf("%s: EDE %d %q, want %d", qname, e.InfoCode, e.ExtraText, tt.code)
					}
				}
			})
		}
	}
}

// A network error is told from a timeout however it is wrapped.
func TestUpstreamErrorCodes(t *testing.T) {
	for _, tt := range []struct {
		err  error
		code uint16
	}{
		{upstream.ErrTimeout, dns.ExtendedErrorCodeNoReachableAuthority},
		{upstream.ErrNameTimeout, dns.ExtendedErrorCodeNoReachableAuthority},
		{errors.Join(errors.New("read"), upstream.ErrTimeout), dns.ExtendedErrorCodeNoReachableAuthority},
		{syscall.ECONNREFUSED, dns.ExtendedErrorCodeNetworkError},
		{nil, dns.ExtendedErrorCodeNetworkError}, // no valid reply
	} {
		if got := upstreamEDE(tt.err).code; got != tt.code {
			t.Errorf("%v: EDE %d, want %d", tt.err, got, tt.code)
		}
	}
}
