package upstream

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// A UDP reply with TC is the answer: the proxy advertises no more than it
// can give its client, so it relays TC and the client comes back over TCP.
func TestExchangeTruncatedReturnsTC(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, tcp bool) []*dns.Msg {
		m := answer(req)
		if !tcp {
			m.Answer, m.Truncated = nil, true
		}
		return []*dns.Msg{m}
	})
	u := newUpstream(t, Config{Addr: srv.addr()})
	r, err := u.Exchange(context.Background(), q("a.example."), "udp")
	if err != nil {
		t.Fatal(err)
	}
	if !r.Truncated || len(r.Answer) != 0 || r.Question[0].Name != "a.example." {
		t.Fatalf("TC=%v with %d answers for %v, want the TC reply as it came", r.Truncated, len(r.Answer), r.Question)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.accepted != 0 {
		t.Fatalf("%d TCP connections, want none", srv.accepted)
	}
}

// A datagram larger than the read buffer cannot be read whole: that answer
// is fetched over TCP.
func TestOversizedUDPReplyGoesToTCP(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, tcp bool) []*dns.Msg {
		m := answer(req)
		for i := range 40 {
			rr, _ := dns.NewRR(fmt.Sprintf("%s 60 IN TXT \"%02d %s\"", req.Question[0].Name, i, strings.Repeat("x", 240)))
			m.Answer = append(m.Answer, rr)
		}
		return []*dns.Msg{m}
	})
	u := newUpstream(t, Config{Addr: srv.addr()})
	r, err := u.Exchange(context.Background(), q("big.example."), "udp")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Answer) != 41 {
		t.Fatalf("%d answers, want all 41", len(r.Answer))
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.accepted != 1 {
		t.Fatalf("%d TCP connections, want 1 for the reply larger than the buffer", srv.accepted)
	}
}
