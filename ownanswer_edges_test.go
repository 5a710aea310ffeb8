package main

import (
	"context"
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"dnsproxi/dnsserver"
	"dnsproxi/guard"
	"dnsproxi/internal/wire"
)

// These tests come from a no-context review of the configuration and of
// the proxy's own answers. Each states a promise of the README.

// rawHeader is a query header with the given counts, RD set.
func rawHeader(id, qd, ar uint16) []byte {
	b := make([]byte, wire.HeaderLen)
	binary.BigEndian.PutUint16(b, id)
	binary.BigEndian.PutUint16(b[2:], wire.FlagRD)
	binary.BigEndian.PutUint16(b[4:], qd)
	binary.BigEndian.PutUint16(b[10:], ar)
	return b
}

// cookieOnlyOPT is an OPT record (size 1232, version 0) holding a client
// cookie only, as RFC 7873 §5.4 sends it to learn a server cookie.
var cookieOnlyOPT = []byte{0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 12, 0, 10, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8}

// The README: "The proxy's own answers (SERVFAIL, REFUSED, FORMERR, NOTIMP)
// carry an OPT to EDNS clients", as RFC 6891 §6.1.1 requires ("If an OPT
// record is present in a received request, compliant responders MUST
// include an OPT record in their respective responses"). A query with no
// question and a readable OPT record (RFC 7873 §5.4's cookie-only query),
// and one whose OPT record reads but is followed by a stray byte, both get
// FORMERR: with their ID, and with an OPT record of the proxy's own.
func TestFormErrCarriesOPTToEDNSClient(t *testing.T) {
	question := []byte{3, 'w', 'W', 'w', 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 0, 0, 1, 0, 1}
	tests := []struct {
		name string
		pkt  []byte
	}{
		{"no question, cookie-only OPT", append(rawHeader(0x1234, 0, 1), cookieOnlyOPT...)},
		{"OPT then a stray byte", append(append(append(rawHeader(0x1234, 1, 1), question...), cookieOnlyOPT...), 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fwd := &scripted{reply: zone(nil)}
			_, srv := unitProxy(nil, fwd)
			w := &recorder{}
			srv.ServePacket(w, tt.pkt)
			if len(w.out) != 1 {
				t.Fatalf("%d answers, %d drops; want one answer", len(w.out), w.dropped)
			}
			ans := w.out[0]
			if len(fwd.sent()) != 0 {
				t.Fatal("a malformed query was forwarded")
			}
			if wire.ID(ans) != 0x1234 || wire.Flags(ans)&0xF != 1 {
				t.Fatalf("answer %x: want FORMERR on ID 0x1234", ans)
			}
			qend := wire.HeaderLen
			if qd, _, _, _ := wire.Counts(ans); qd == 1 {
				if qend, _ = wire.QuestionEnd(ans); qend == 0 {
					t.Fatalf("answer %x: question unreadable", ans)
				}
			}
			sec, ok := wire.ReadSections(ans, qend)
			if !ok || sec.End != len(ans) {
				t.Fatalf("answer %x framed badly", ans)
			}
			if !sec.OPT.Present {
				t.Fatalf("FORMERR %x to a client that sent an OPT record carries none", ans)
			}
		})
	}
}

// The README: "every number and duration has a range", and a bad value
// "stops start-up with one line that names the variable ... and exit code
// 2". A Redis URL whose port is beyond 65535, or whose database number is
// negative, is a typo that can never reach Redis (or, for -1, silently
// means database 0): since "a Redis that is down at start-up is not an
// error", accepting it leaves the fleet on its local share for good with
// nothing said at start-up.
func TestRedisURLNumbersBounded(t *testing.T) {
	for _, url := range []string{
		"redis://127.0.0.1:99999/0",  // port beyond 65535
		"redis://127.0.0.1:29998/-1", // a negative database (nothing listens there)
	} {
		t.Run(url, func(t *testing.T) {
			env := map[string]string{"DNS_UPSTREAM": "127.0.0.1:29500", "DNS_LISTEN": "127.0.0.1:29501", "DNS_METRICS_ADDR": "off",
				"DNS_UPSTREAM_RATE_LIMIT": "100", "DNS_UPSTREAM_RATE_LIMIT_REDIS": url, "DNS_UPSTREAM_RATE_LIMIT_REDIS_TIMEOUT": "5ms"}
			setEnv(t, env)
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // accepted, it starts and stops at once
			var stdout, stderr syncBuffer
			code := run(ctx, nil, &stdout, &stderr, nil)
			out := stderr.String()
			if code != 2 || strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, `dnsproxi: DNS_UPSTREAM_RATE_LIMIT_REDIS="`+url+`": `) {
				t.Fatalf("exit %d, stderr %q; want exit 2 and one line naming DNS_UPSTREAM_RATE_LIMIT_REDIS", code, out)
			}
		})
	}
}

// settleUpstreams promises a list with "none repeated", and refuses
// [::1]:53 beside [0:0:0:0:0:0:0:1]:53. 127.0.0.1:5300 written a second time
// as the IPv4-mapped [::ffff:127.0.0.1]:5300 is the same upstream (the
// loop check already unmaps it): two breakers and a hedge to itself.
func TestUpstreamRepeatedAsMappedAddress(t *testing.T) {
	env := map[string]string{"DNS_UPSTREAM": "127.0.0.1:5300,[::ffff:127.0.0.1]:5300"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	cfg, err := readConfig(lookup, &fakeResolver{t: t})
	if err == nil {
		t.Fatalf("accepted: upstreams %q, hedge %v", cfg.Upstream, cfg.UpstreamHedge)
	}
	if !strings.HasPrefix(err.Error(), `DNS_UPSTREAM="127.0.0.1:5300,[::ffff:127.0.0.1]:5300": entry 2`) {
		t.Fatalf("error %v; want entry 2 named as a repeat", err)
	}
}

// The REFUSED the server gives a TCP query beyond its bound on unanswered
// queries is built as the proxy's own answers are (the server calls
// refuseUnanswered): to a client that sent EDNS, an OPT record with the
// EDE naming the limit. Before, the server built a bare REFUSED with no OPT
// (dnsserver.TestPendingCapRefusalCarriesOPT) and RA always set.
func TestUnansweredBoundRefusalIsTheProxysOwn(t *testing.T) {
	p, _ := unitProxy(nil, &scripted{reply: zone(nil)})
	srv := &dnsserver.Server{Handler: dnsserver.HandlerFunc(p.refuseUnanswered)}
	m := new(dns.Msg)
	m.SetQuestion("www.example.com.", dns.TypeA)
	m.SetEdns0(1232, true)
	m.Id = 0x4242
	r, _ := serveMsg(t, srv, m)
	if r == nil || r.Rcode != dns.RcodeRefused || r.Id != 0x4242 || len(r.Question) != 1 {
		t.Fatalf("answer %v, want REFUSED on its ID and question", r)
	}
	opt := r.IsEdns0()
	if opt == nil || !opt.Do() {
		t.Fatalf("no OPT record, or DO not echoed:\n%v", r)
	}
	var found bool
	for _, o := range opt.Option {
		if e, ok := o.(*dns.EDNS0_EDE); ok && e.InfoCode == dns.ExtendedErrorCodeOther && strings.Contains(e.ExtraText, "in flight") {
			found = true
		}
	}
	if !found {
		t.Fatalf("no EDE naming the limit:\n%v", r)
	}
}

// A client outside DNS_ALLOW that meets the bound on unanswered queries is
// told what it would be told any other time, EDE 18 "Prohibited", not that
// the proxy is busy: a refusal must not tell an outsider how loaded the
// proxy is, nor suggest that it would be answered later.
func TestUnansweredBoundRefusalOfAnOutsiderIsProhibited(t *testing.T) {
	p, _ := unitProxy(nil, &scripted{reply: zone(nil)})
	p.access = guard.NewAccessList(netip.MustParsePrefix("10.0.0.0/8"))
	srv := &dnsserver.Server{Handler: dnsserver.HandlerFunc(p.refuseUnanswered)}
	m := new(dns.Msg)
	m.SetQuestion("www.example.com.", dns.TypeA)
	m.SetEdns0(1232, false)
	r, _ := serveMsg(t, srv, m)
	if r == nil || r.Rcode != dns.RcodeRefused {
		t.Fatalf("answer %v, want REFUSED", r)
	}
	e, has := edeOf(r)
	if !has || e.InfoCode != dns.ExtendedErrorCodeProhibited {
		t.Fatalf("EDE %v, want 18 (Prohibited): the client is outside the access list", e)
	}
}
