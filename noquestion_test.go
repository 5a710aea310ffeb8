package main

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
)

// bareError is the reply an old server gives a query it cannot parse or
// will not serve: the ID, QR, the opcode and rcode, and no question.
func bareError(req *dns.Msg, rcode int) []byte {
	m := new(dns.Msg)
	m.Id, m.Response, m.Opcode, m.Rcode = req.Id, true, req.Opcode, rcode
	b, _ := m.Pack()
	return b
}

// oldServer answers a query that carries an OPT record with rcode and no
// question section, as servers that predate EDNS do, and any other query well.
func oldServer(t *testing.T, rcode int) string {
	t.Helper()
	up := startUpstream(t)
	up.SetScript(func(req *dns.Msg, _ string) [][]byte {
		if req.IsEdns0() != nil {
			return [][]byte{bareError(req, rcode)}
		}
		b, _ := answerFor(req).Pack()
		return [][]byte{b}
	})
	return up.Addr()
}

// An upstream's FORMERR, NOTIMP or REFUSED without a question section (RFC
// 1035 lets a server that cannot parse a query leave it out; servers that
// predate EDNS send it to every query with an OPT record) is its answer:
// the client gets that rcode at once, with its own ID and question, and can
// fall back to a query without EDNS as it would against the server itself.
// Real resolvers take such a reply when its ID matches (Unbound, with 0x20
// on, unless it is NOERROR or NXDOMAIN; dnsdist likewise). Before, the
// reply was ignored as not matching: the client waited out the upstream
// timeout and got SERVFAIL, counted upstream_error.
func TestUpstreamErrorWithoutQuestionIsItsAnswer(t *testing.T) {
	for _, rcode := range []int{dns.RcodeFormatError, dns.RcodeNotImplemented, dns.RcodeRefused} {
		for _, network := range []string{"udp", "tcp"} {
			t.Run(dns.RcodeToString[rcode]+"/"+network, func(t *testing.T) {
				cfg := testConfig(oldServer(t, rcode))
				a := startProxy(t, cfg, guard.RealClock{})
				m := query("Old.Example.com", dns.TypeA)
				m.Id = 0x5151
				m.SetEdns0(1232, false)
				start := time.Now()
				r := ask(t, network, a.addr(), m)
				took := time.Since(start)
				if r.Rcode != rcode {
					t.Fatalf("got %s after %v (upstream timeout %v), want the upstream's %s",
						rcodeName(r), took, cfg.UpstreamTimeout, dns.RcodeToString[rcode])
				}
				if r.Id != m.Id || len(r.Question) != 1 || r.Question[0] != m.Question[0] {
					t.Errorf("answer ID %#x question %v, want %#x %v", r.Id, r.Question, m.Id, m.Question[0])
				}
				if got := count(a, "A", "forwarded", 1); got != 1 {
					t.Errorf("forwarded %d, want 1", got)
				}
				// The client's fallback, without EDNS, is answered.
				if r := ask(t, network, a.addr(), query("old.example.com", dns.TypeA)); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
					t.Errorf("without EDNS: %s with %q, want the answer", rcodeName(r), answerText(r))
				}
			})
		}
	}
}

// EDNS clients of an upstream that predates EDNS do not open its breaker:
// each of its bare FORMERRs is an answer, so the clients that ask without
// EDNS are still served. Before, MinSamples EDNS queries timed out with
// nothing answered, the breaker opened, and every client got SERVFAIL.
func TestUpstreamErrorWithoutQuestionLeavesTheBreakerClosed(t *testing.T) {
	cfg := testConfig(oldServer(t, dns.RcodeFormatError))
	cfg.BreakerThreshold, cfg.BreakerMinSamples, cfg.BreakerWindow = 50, 20, 100
	a := startProxy(t, cfg, guard.RealClock{})
	c, err := net.Dial("udp", a.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var qs []*dns.Msg
	for i := range cfg.BreakerMinSamples {
		m := query(fmt.Sprintf("e%d.example.com", i), dns.TypeA)
		m.Id = uint16(i + 1)
		m.SetEdns0(1232, false)
		qs = append(qs, m)
	}
	sendAll(t, c, qs)
	if got := readRcodes(t, c, qs); got[dns.RcodeFormatError] != len(qs) {
		t.Errorf("EDNS queries got rcodes %v, want %d FORMERR", got, len(qs))
	}
	if s := a.breaker(0).State(); s != guard.Closed {
		t.Errorf("breaker %v after %d bare FORMERRs, want closed", s, len(qs))
	}
	if r := ask(t, "udp", a.addr(), query("plain.example.com", dns.TypeA)); r.Rcode != dns.RcodeSuccess {
		t.Errorf("a query without EDNS got %s, want NOERROR", rcodeName(r))
	}
}

// An error without a question is read like any answer: its OPT record's
// extended rcode counts, so a BADCOOKIE (YXRRSET in the header's four bits)
// is about the proxy's own OPT and never relayed (hopError), and an
// extended rcode reaches no client that sent no OPT.
func TestUpstreamErrorWithoutQuestionKeepsItsExtendedRcode(t *testing.T) {
	up := startUpstream(t)
	up.SetScript(func(req *dns.Msg, _ string) [][]byte {
		m := new(dns.Msg)
		m.Id, m.Response = req.Id, true
		m.SetEdns0(1232, false)
		m.Rcode = dns.RcodeBadCookie // packed as 7 in the header, 1 in the OPT
		b, _ := m.Pack()
		return [][]byte{b}
	})
	a := startProxy(t, testConfig(up.Addr()), guard.RealClock{})
	m := query("cookie.example.com", dns.TypeA)
	m.SetEdns0(1232, false)
	if r := ask(t, "udp", a.addr(), m); r.Rcode != dns.RcodeServerFailure {
		t.Errorf("a bare BADCOOKIE got %s to the client, want SERVFAIL", rcodeName(r))
	}
	if got := count(a, "A", "upstream_error", 1); got != 1 {
		t.Errorf("upstream_error %d, want 1", got)
	}
}
