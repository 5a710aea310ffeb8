package dnsserver

import (
	"context"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// From a no-context review. The README: "The proxy's own answers
// (SERVFAIL, REFUSED, FORMERR, NOTIMP) carry an OPT to EDNS clients", as
// RFC 6891 §6.1.1 requires. The REFUSED a TCP query gets beyond
// MaxUnanswered is one of them: a client that sent EDNS gets an OPT record
// back, on its own ID.
func TestPendingCapRefusalCarriesOPT(t *testing.T) {
	h := newHolder()
	s := &Server{Addr: "127.0.0.1:29502", MaxUnanswered: 1, Handler: h}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	}()
	defer h.release()
	addr := s.LocalAddr().String()
	go ask("udp", addr, 5*time.Second) // held: the server is at its bound
	select {
	case <-h.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the first query never reached the handler")
	}
	m := new(dns.Msg)
	m.SetQuestion("www.example.com.", dns.TypeA)
	m.SetEdns0(1232, true)
	m.Id = 0x4242
	r, _, err := (&dns.Client{Net: "tcp", Timeout: 3 * time.Second}).Exchange(m, addr)
	if err != nil || r.Rcode != dns.RcodeRefused || r.Id != 0x4242 {
		t.Fatalf("tcp beyond MaxUnanswered: %v %v, want REFUSED at once", r, err)
	}
	if r.IsEdns0() == nil {
		t.Fatalf("REFUSED to a client that sent EDNS carries no OPT record:\n%v", r)
	}
}
