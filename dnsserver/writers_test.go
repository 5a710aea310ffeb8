//go:build unix

package dnsserver

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/batchio"
	"dnsproxi/internal/udptest"
)

// A server given a writers group puts each UDP socket's writer in it while
// it serves, and takes them out when it shuts down.
func TestServerJoinsItsWritersGroup(t *testing.T) {
	var g batchio.Group
	s := &Server{UDPSockets: 2, Writers: &g}
	startServer(t, s)
	held := g.Hold()
	batchio.Release(held)
	if want := len(s.udp); len(held) != want {
		t.Fatalf("the group holds %d writers while serving, want %d (one a socket)", len(held), want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if held := g.Hold(); len(held) != 0 {
		t.Fatalf("the group still holds %d writers after Shutdown", len(held))
	}
}

// While a UDP reader serves a batch of queries it holds Forwards: a query
// the handler forwards through a writer of that group leaves when the
// batch is served, not from inside the handler.
func TestReaderHoldsForwardsWhileServing(t *testing.T) {
	sink := udptest.Listen(t)
	w, err := batchio.NewWriter(udptest.Listen(t))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var forwards batchio.Group
	forwards.Add(w)
	leftEarly := make(chan bool, 1)
	addr := startServer(t, &Server{Forwards: &forwards, Handler: HandlerFunc(func(rw ResponseWriter, q *Query) {
		w.Send(sink.LocalAddr().(*net.UDPAddr).AddrPort(), q.Wire)
		leftEarly <- udptest.Waiting(t, sink) // loopback delivers within the send: anything sent is there now
		rw.Drop()
	})})
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := new(dns.Msg)
	m.SetQuestion("held.example.", dns.TypeA)
	b, _ := m.Pack()
	c.Write(b)
	select {
	case early := <-leftEarly:
		if early {
			t.Fatal("the forwarded query left from inside the handler: the reader did not hold Forwards")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler never ran")
	}
	sink.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := sink.Read(make([]byte, 512)); err != nil {
		t.Fatalf("the forwarded query never left once the batch was served: %v", err)
	}
}
