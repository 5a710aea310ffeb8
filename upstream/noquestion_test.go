package upstream

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// An error without a question section (a server that cannot parse a query
// may leave it out, RFC 1035 §4.1.1) answers the query whose ID it
// carries, over UDP and TCP: the caller gets it at once, with its own ID and
// question in its own case, the rest of the reply (its OPT) as it came.
// NOERROR and NXDOMAIN claim an answer about a name and must name it, so
// without a question they are ignored, as Unbound does with 0x20 on; so is
// an error that carries records about no question, in any section but
// its OPT. Before, every such
// reply was ignored and the query waited out its deadline.
func TestErrorWithoutQuestionAnswers(t *testing.T) {
	bare := func(req *dns.Msg, rcode int, opt bool, record, extra bool) *dns.Msg {
		m := new(dns.Msg)
		m.Id, m.Response, m.Rcode = req.Id, true, rcode
		if opt {
			m.SetEdns0(512, false)
		}
		if record {
			rr, _ := dns.NewRR("x.example. 60 IN A 192.0.2.9")
			m.Answer = []dns.RR{rr}
		}
		if extra {
			rr, _ := dns.NewRR("x.example. 60 IN A 192.0.2.9")
			m.Extra = append([]dns.RR{rr}, m.Extra...)
		}
		return m
	}
	for _, tt := range []struct {
		name        string
		rcode       int
		opt, record bool
		extra       bool // an additional record besides the OPT
		answered    bool
	}{
		{"FORMERR", dns.RcodeFormatError, false, false, false, true},
		{"SERVFAIL", dns.RcodeServerFailure, false, false, false, true},
		{"NOTIMP", dns.RcodeNotImplemented, false, false, false, true},
		{"REFUSED", dns.RcodeRefused, false, false, false, true},
		{"FORMERR with OPT", dns.RcodeFormatError, true, false, false, true},
		{"NOERROR", dns.RcodeSuccess, false, false, false, false},
		{"NXDOMAIN", dns.RcodeNameError, false, false, false, false},
		{"REFUSED with an answer record", dns.RcodeRefused, false, true, false, false},
		{"REFUSED with an additional record", dns.RcodeRefused, true, false, true, false},
	} {
		for _, network := range []string{"udp", "tcp"} {
			t.Run(tt.name+"/"+network, func(t *testing.T) {
				s := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg {
					return []*dns.Msg{bare(req, tt.rcode, tt.opt, tt.record, tt.extra)}
				})
				u := newUpstream(t, Config{Addr: s.addr(), Timeout: 300 * time.Millisecond})
				m := q("Bare.Example.")
				r, err := u.Exchange(context.Background(), m, network)
				if !tt.answered {
					if !errors.Is(err, ErrTimeout) {
						t.Fatalf("got %v, %v; want the reply ignored, ErrTimeout", r, err)
					}
					return
				}
				if err != nil {
					t.Fatalf("got %v, want the upstream's %s", err, dns.RcodeToString[tt.rcode])
				}
				if r.Rcode != tt.rcode || r.Id != m.Id || len(r.Question) != 1 || r.Question[0] != m.Question[0] {
					t.Fatalf("got %s ID %d question %v, want %s ID %d %v",
						dns.RcodeToString[r.Rcode], r.Id, r.Question, dns.RcodeToString[tt.rcode], m.Id, m.Question[0])
				}
				if got := r.IsEdns0() != nil; got != tt.opt {
					t.Errorf("OPT in the reply: %v, want %v", got, tt.opt)
				}
			})
		}
	}
}

// A probe's verdict is the case of a question: an error without one is no
// reply to it, while to any other query it is the answer.
func TestProbeTakesNoErrorWithoutQuestion(t *testing.T) {
	query, _ := q("Probe.Example.").Pack()
	qend, _ := wireQuestionEnd(query)
	reply := append([]byte(nil), query[:12]...)
	reply[2], reply[3], reply[5] = 0x80, dns.RcodeRefused, 0 // QR, REFUSED, no question
	for _, probe := range []bool{false, true} {
		c := &call{wire: query, qend: qend, probe: probe}
		want := replyBare
		if probe {
			want = replyForeign
		}
		if got := c.match(reply); got != want {
			t.Errorf("probe %v: verdict %d, want %d", probe, got, want)
		}
	}
}
