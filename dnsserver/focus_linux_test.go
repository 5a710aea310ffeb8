package dnsserver

import (
	"sync/atomic"
	"testing"
	"time"
)

// FocusUDP(true) sends every client's queries to the first socket, whose
// reader then takes them in large batches; FocusUDP(false) spreads them
// over every socket again.
func TestFocusUDPSteersEveryQueryToTheFirstSocket(t *testing.T) {
	s := &Server{UDPSockets: 2}
	var per [2]atomic.Int64 // queries read by each socket
	s.Handler = HandlerFunc(func(w ResponseWriter, q *Query) {
		if uw, ok := w.(*udpWriter); ok {
			for i, u := range s.udp {
				if uw.out == u.writer {
					per[i].Add(1)
				}
			}
		}
		echo(w, q)
	})
	addr := startServer(t, s)
	// Each ask is a new client socket on a port of its own: the kernel's
	// spread, by client address, would put about half on each socket.
	const clients = 64
	askEach := func() {
		t.Helper()
		per[0].Store(0)
		per[1].Store(0)
		for i := range clients {
			if _, err := ask("udp", addr, 2*time.Second); err != nil {
				t.Fatalf("client %d: %v", i, err)
			}
		}
		if got := per[0].Load() + per[1].Load(); got != clients {
			t.Fatalf("the sockets read %d queries, want %d", got, clients)
		}
	}

	if err := s.FocusUDP(true); err != nil {
		t.Fatal(err)
	}
	askEach()
	if n := per[1].Load(); n != 0 {
		t.Errorf("focused: %d of %d clients' queries reached the second socket, want none", n, clients)
	}

	if err := s.FocusUDP(false); err != nil {
		t.Fatal(err)
	}
	askEach()
	// By hash, all 64 on one socket has a chance of 2^-63.
	if per[0].Load() == 0 || per[1].Load() == 0 {
		t.Errorf("spread again: the sockets read %d and %d of %d clients' queries, want some on each", per[0].Load(), per[1].Load(), clients)
	}
	if err := s.FocusUDP(false); err != nil {
		t.Errorf("spreading what is spread already: %v", err)
	}
}
