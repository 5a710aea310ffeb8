package main

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
)

// These tests come from a no-context review of the proxy's entry: the
// access list, the limit actions and the proxy's own answers. Each states a
// promise of the README.

// The start-up log warns of an open resolver "for a list holding 0.0.0.0/0
// or ::/0", and the commit that added it says for "any list that lets a
// whole address family in". The access list reads ::ffff:0:0/96 as
// 0.0.0.0/0 (guard/acl.go: "::ffff:0:0/96 and longer are read as IPv4
// prefixes"), and 0.0.0.0/1 with 128.0.0.0/1 holds every IPv4 address as
// well: both let every IPv4 client in, and neither is warned of.
func TestStartupWarnsOfEveryOpenFamily(t *testing.T) {
	probes := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("203.0.113.200")}
	for _, allow := range []string{"::ffff:0.0.0.0/96", "0.0.0.0/1,128.0.0.0/1"} {
		t.Run(allow, func(t *testing.T) {
			var rule AccessRule
			if err := rule.Decode(allow); err != nil {
				t.Fatalf("refused: %v", err)
			}
			list := rule.list()
			for _, a := range probes {
				if !list.Contains(a) {
					t.Fatalf("%s does not hold %s: not an open list after all", allow, a)
				}
			}
			setEnv(t, map[string]string{"DNS_UPSTREAM": "127.0.0.1:53", "DNS_LISTEN": "127.0.0.1:0", "DNS_METRICS_ADDR": "off",
				"DNS_ALLOW": allow})
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // it starts, warns or not, and stops at once
			var stdout, stderr syncBuffer
			if code := run(ctx, nil, &stdout, &stderr, nil); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), "open resolver") {
				t.Fatalf("DNS_ALLOW=%s lets every IPv4 address query, and start-up did not warn:\n%s", allow, stderr.String())
			}
		})
	}
}

// A zone transfer's REFUSED, NOTIMP, FORMERR (two questions included) and
// BADVERS carry an OPT to a client that sent one (RFC 6891 §6.1.1), and no
// Extended DNS Error: no bucket bounds these answers, so they must not grow
// past the query (TestOwnErrorAnswersDoNotAmplify). A review first found
// them without an EDE against a README that promised one on every own
// answer; the EDE added then made them a reflector, and the README now
// says which answers carry one.
func TestOwnErrorAnswersCarryOPTNotEDE(t *testing.T) {
	twoQuestions := func() *dns.Msg {
		m := ednsQuery("www.example.com", dns.TypeA, 1232, false)
		m.Question = append(m.Question, dns.Question{Name: "www.example.net.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
		return m
	}
	tests := []struct {
		name  string
		msg   func() *dns.Msg
		rcode int
	}{
		{"AXFR", func() *dns.Msg { return ednsQuery("example.com", dns.TypeAXFR, 1232, false) }, dns.RcodeRefused},
		{"IXFR", func() *dns.Msg { return ednsQuery("example.com", dns.TypeIXFR, 1232, false) }, dns.RcodeRefused},
		{"NOTIFY", func() *dns.Msg {
			m := ednsQuery("example.com", dns.TypeSOA, 1232, false)
			m.Opcode = dns.OpcodeNotify
			return m
		}, dns.RcodeNotImplemented},
		{"two questions", twoQuestions, dns.RcodeFormatError},
		{"EDNS version 1", func() *dns.Msg {
			m := ednsQuery("www.example.com", dns.TypeA, 1232, false)
			m.IsEdns0().SetVersion(1)
			return m
		}, dns.RcodeBadVers},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fwd := &scripted{reply: zone(nil)}
			_, srv := unitProxy(nil, fwd)
			r, raw := serveMsg(t, srv, tt.msg())
			if r == nil || r.Rcode != tt.rcode {
				t.Fatalf("answer %v, want %s", r, dns.RcodeToString[tt.rcode])
			}
			if len(fwd.sent()) != 0 {
				t.Fatal("forwarded")
			}
			if r.IsEdns0() == nil {
				t.Fatalf("no OPT to an EDNS client: %x", raw)
			}
			if e, has := edeOf(r); has {
				t.Fatalf("%s carries EDE %v: unbounded answers to forged sources must not grow (TestOwnErrorAnswersDoNotAmplify)", dns.RcodeToString[tt.rcode], e)
			}
		})
	}
}

// The README: slip "sends every Nth refused query an empty answer with TC
// set and drops the rest, so ... a spoofed flood gets nothing to amplify".
// Each TC answer carries the query's question and an OPT like the query's,
// plus an EDE option the query did not have ("rate limit": 6 + 10 bytes),
// so with slip:1 (accepted: N is 1..10) every refused query of a flood is
// reflected larger than it came: 28 bytes in ("." NS with an OPT record),
// 44 out (1.57×; 1.82× with the per-client gate's "client rate limit"). The test sums, for N = 1..3, the bytes a flood's refused
// queries sent against the bytes answered to them.
func TestSlipDoesNotAmplify(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		t.Run("slip:"+string(rune('0'+n)), func(t *testing.T) {
			clock := guard.NewManualClock(time.Unix(1_000_000, 0))
			p, srv := unitProxy(guard.NewTokenBucket(0.001, 1, clock), &scripted{reply: zone(nil)})
			p.clock = clock
			p.action = LimitAction{Kind: ActionSlip, N: n}
			m := ednsQuery(".", dns.TypeNS, 1232, false)
			pkt, err := m.Pack()
			if err != nil {
				t.Fatal(err)
			}
			if r, _ := servePkt(t, srv, pkt); r == nil { // the bucket's one token
				t.Fatal("the first query got no answer")
			}
			const refused = 60
			in, out, answered := 0, 0, 0
			for range refused {
				in += len(pkt)
				r, raw := servePkt(t, srv, pkt)
				if r != nil {
					if !r.Truncated {
						t.Fatalf("a refused query answered without TC:\n%v", r)
					}
					answered++
					out += len(raw)
				}
			}
			if answered != refused/n {
				t.Fatalf("%d of %d refused queries answered, want %d", answered, refused, refused/n)
			}
			t.Logf("slip:%d: %d refused queries, %d bytes in; %d answered, %d bytes out (%.2f×)", n, refused, in, answered, out, float64(out)/float64(in))
			if out > in {
				t.Fatalf("slip:%d: a spoofed flood of %d bytes was reflected as %d bytes (%.2f×): amplified", n, in, out, float64(out)/float64(in))
			}
		})
	}
}

// The README: over UDP the REFUSED answers to denied clients "share a
// bucket of 10 a second and beyond it are dropped, so a flood with forged
// sources can make the proxy reflect at most 10 small answers a second".
// The bucket holds one token (deniedBurst), so within the first second of
// a flood, after a quiet spell, it reflects 1 + 10 at most. The flood here
// is 200 denied queries, one every 5 ms, over 995 ms: 10 answered.
func TestDeniedAnswersAtMostTenPerSecond(t *testing.T) {
	clock := guard.NewManualClock(time.Unix(1_000_000, 0))
	fwd := &scripted{reply: zone(nil)}
	p, srv := unitProxy(nil, fwd)
	p.clock = clock
	p.access, p.denied, _ = initAccess(Config{Allow: AccessRule{Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}}, clock)
	clock.Advance(time.Minute) // a quiet spell before the flood
	answered := 0
	for i := range 200 {
		if i > 0 {
			clock.Advance(5 * time.Millisecond)
		}
		if r, _ := serveMsg(t, srv, ednsQuery("www.example.com", dns.TypeA, 1232, false)); r != nil {
			if r.Rcode != dns.RcodeRefused {
				t.Fatalf("a denied query answered %s", rcodeName(r))
			}
			answered++
		}
	}
	if len(fwd.sent()) != 0 {
		t.Fatal("a denied query was forwarded")
	}
	if got := outcomes(p, "A", "denied"); got != 200 {
		t.Fatalf("%d counted denied, want 200", got)
	}
	if answered > 10 {
		t.Fatalf("a forged flood got %d REFUSED answers reflected within 995 ms; the README promises at most 10 a second", answered)
	}
}

// The README: "The proxy's own answers (SERVFAIL, REFUSED, FORMERR,
// NOTIMP) carry an OPT to EDNS clients", as RFC 6891 §6.1.1 requires. A
// query with two questions and an OPT record gets FORMERR without one:
// the server stops reading at the second question (dnsserver/server.go,
// parse: "the records after the second question are not read"), so the
// proxy never learns the client sent EDNS.
func TestFormErrToTwoQuestionsCarriesOPT(t *testing.T) {
	m := ednsQuery("www.example.com", dns.TypeA, 1232, true)
	m.Question = append(m.Question, dns.Question{Name: "www.example.net.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	fwd := &scripted{reply: zone(nil)}
	p, srv := unitProxy(nil, fwd)
	r, raw := serveMsg(t, srv, m)
	if r == nil || r.Rcode != dns.RcodeFormatError {
		t.Fatalf("answer %v, want FORMERR", r)
	}
	if got := outcomes(p, "OTHER", "formerr"); got != 1 {
		t.Fatalf("counted %d under OTHER/formerr, want 1", got)
	}
	if r.IsEdns0() == nil {
		t.Fatalf("FORMERR %x to a client that sent an OPT record (DO set) carries none", raw)
	}
}
