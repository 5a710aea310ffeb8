package main

import (
	"testing"

	"github.com/miekg/dns"
)

// BADVERS and BADCOOKIE in an upstream's reply are about the proxy's own
// OPT on the upstream's hop (version 0, no cookie: RFC 6891 §6.1.3, RFC
// 7873 §5.3), never about the client's query: relayed, they would tell the
// client its EDNS version or its cookie is wrong, which it cannot act on.
// Such a reply is no valid reply — a failure, as DESIGN.md defines it — so
// the query ends as any failure does: SERVFAIL (outcome upstream_error),
// and the upstream's rcode never reaches the client.
func TestUpstreamBADVERSAndBADCOOKIEAreNoAnswer(t *testing.T) {
	tests := []struct {
		name  string
		rcode int
	}{
		{"BADVERS", dns.RcodeBadVers},
		{"BADCOOKIE", dns.RcodeBadCookie},
	}
	for _, tt := range tests {
		for _, q := range []*dns.Msg{ednsQuery("www.example.com", dns.TypeA, 1232, true), query("www.example.com", dns.TypeA)} {
			t.Run(tt.name+map[bool]string{true: " EDNS client", false: " client without EDNS"}[q.IsEdns0() != nil], func(t *testing.T) {
				p, srv := unitProxy(nil, &scripted{reply: zone(func(req, m *dns.Msg) {
					m.Answer, m.Extra = nil, nil
					m.SetEdns0(1232, false)
					m.Rcode = tt.rcode // the extended part goes in the OPT when packed
				})})
				r, _ := serveMsg(t, srv, q)
				if r.Rcode != dns.RcodeServerFailure || r.Id != q.Id {
					t.Fatalf("rcode %s, ID %d; want SERVFAIL and %d: the upstream's %s about the proxy's OPT reached the client",
						rcodeName(r), r.Id, q.Id, tt.name)
				}
				if got := outcomes(p, "A", "upstream_error"); got != 1 {
					t.Fatalf("upstream_error %d, want 1 (forwarded %d)", got, outcomes(p, "A", "forwarded"))
				}
			})
		}
	}
}
