package dnsserver

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
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

// askMany sends one query from each of n new client sockets at once, and
// returns how many were answered within timeout.
func askMany(t *testing.T, addr string, n int, timeout time.Duration) int {
	t.Helper()
	return answers(sendMany(t, addr, n), time.Now().Add(timeout))
}

// sendMany sends one query from each of n new client sockets, closed when
// the test ends.
func sendMany(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion("www.example.com.", dns.TypeA)
	pkt, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	clients := make([]net.Conn, n)
	for i := range clients {
		c, err := net.Dial("udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write(pkt); err != nil {
			t.Fatal(err)
		}
		clients[i] = c
	}
	return clients
}

// answers returns how many of the clients read an answer by deadline.
func answers(clients []net.Conn, deadline time.Time) int {
	answered := 0
	for _, c := range clients {
		// Once a read has waited out the deadline, the others still look
		// at what their sockets hold: a deadline already past would make
		// them fail without reading.
		if last := time.Now().Add(10 * time.Millisecond); last.After(deadline) {
			c.SetReadDeadline(last)
		} else {
			c.SetReadDeadline(deadline)
		}
		if _, err := c.Read(make([]byte, 512)); err == nil {
			answered++
		}
	}
	return answered
}

// A socket of the same user bound to the port with SO_REUSEPORT before the
// server joins the kernel's group with the server's sockets, and is the
// group's first: the spread gives it a share of the queries, but focusing
// must not give it all of them.
func TestFocusUDPNeverHandsEveryQueryToASocketBoundBefore(t *testing.T) {
	before, err := listenReusePort(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { before.Close() })
	s := &Server{UDPSockets: 2}
	addr := startAt(t, s, before.LocalAddr().String())
	focusErr := s.FocusUDP(true)
	// Spread, two thirds of the clients reach the server: none of 32 has a
	// chance of 3^-32.
	const clients = 32
	if n := askMany(t, addr, clients, time.Second); n == 0 {
		t.Fatalf("focused on a port shared with a socket bound before the server: %d of %d queries answered, every one went to that socket", n, clients)
	}
	if !errors.Is(focusErr, ErrUDPPortShared) {
		t.Errorf("FocusUDP on a port shared with a socket bound before: %v, want ErrUDPPortShared", focusErr)
	}
}

// Sockets of the same user that join the port after the server (SO_REUSEPORT)
// share the kernel's group with it, and the group, with the program that
// steers it, outlives the server's sockets. Once the server has shut down,
// the kernel must spread the queries over those sockets as it would had the
// server never focused, not send every one to whichever of them is first now.
func TestShutdownGivesTheKernelItsSpreadBack(t *testing.T) {
	s := &Server{UDPSockets: 2}
	addr := startServer(t, s)
	var after [2]*net.UDPConn
	for i := range after {
		c, err := listenReusePort(netip.MustParseAddrPort(addr))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		after[i] = c
	}
	if err := s.FocusUDP(true); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.FocusUDP(true); err == nil {
		t.Errorf("FocusUDP after Shutdown: nil, want an error")
	}

	const clients = 64
	for range clients {
		c, err := net.Dial("udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Write([]byte("a packet from a client of its own"))
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	var got [2]int
	for i, c := range after {
		for range clients {
			c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			if _, err := c.Read(make([]byte, 512)); err != nil {
				break
			}
			got[i]++
		}
	}
	// By hash, all 64 on one socket has a chance of 2^-63.
	if got[0] == 0 || got[1] == 0 {
		t.Errorf("after the server shut down, the sockets that joined its port read %d and %d of %d clients' packets, want some on each", got[0], got[1], clients)
	}
}

// FocusUDP's promise: queries already queued on another socket when the
// kernel starts handing every new one to the first are still read and
// answered. The second socket's reader is held in the handler while the
// clients' queries arrive, so that its share waits in its socket.
func TestFocusUDPAnswersWhatTheOtherSocketsHold(t *testing.T) {
	s := &Server{UDPSockets: 2}
	held, release := make(chan struct{}), make(chan struct{})
	var holding atomic.Bool
	s.Handler = HandlerFunc(func(w ResponseWriter, q *Query) {
		if uw, ok := w.(*udpWriter); ok && uw.out == s.udp[1].writer && !holding.Swap(true) {
			close(held)
			select {
			case <-release:
			case <-time.After(5 * time.Second):
			}
		}
		echo(w, q)
	})
	addr := startServer(t, s)
	const clients = 64
	sent := sendMany(t, addr, clients)
	select {
	case <-held:
	case <-time.After(5 * time.Second):
		t.Fatal("no query reached the second socket")
	}
	err := s.FocusUDP(true)
	close(release)
	if err != nil {
		t.Fatal(err)
	}
	if n := answers(sent, time.Now().Add(5*time.Second)); n != clients {
		t.Errorf("%d of %d queries answered, with the second socket's focused away", n, clients)
	}
}
