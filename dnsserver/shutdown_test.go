package dnsserver

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// A connection's reader that is between two queries when Shutdown wakes it
// must not read another: arming its idle deadline must not undo the wake-up.
func TestShutdownStopsReadingTCP(t *testing.T) {
	var served atomic.Int64
	arrived, woken := make(chan struct{}), make(chan struct{})
	var arms atomic.Int64
	s := &Server{
		TCPIdleTimeout: time.Minute,
		Handler: HandlerFunc(func(w ResponseWriter, q *Query) {
			served.Add(1)
			echo(w, q)
		}),
		// The reader stops just before arming the deadline for its second
		// query, until Shutdown has woken every reader.
		beforeArm: func() {
			if arms.Add(1) == 2 {
				close(arrived)
				<-woken
			}
		},
		afterWake: func() { close(woken) },
	}
	addr := startServer(t, s)
	c, err := dns.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := c.WriteMsg(new(dns.Msg).SetQuestion("first.example.", dns.TypeA)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReadMsg(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	case <-time.After(5 * time.Second):
		t.Fatal("the reader did not come back for a second query")
	}
	// The second query waits in the socket while Shutdown runs.
	if err := c.WriteMsg(new(dns.Msg).SetQuestion("second.example.", dns.TypeA)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if n := served.Load(); n != 1 {
		t.Fatalf("the handler was given %d queries, want 1: a query was read after Shutdown", n)
	}
	if !drainUntilClosed(c, 5*time.Second) {
		t.Fatal("the connection is still open after Shutdown")
	}
}

// Shutdown returns only once every answer to a query taken before it is on
// the wire: none is lost to a socket closed under it.
func TestShutdownSendsEveryAnswer(t *testing.T) {
	const clients = 50
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			h := newHolder()
			h.entered = make(chan struct{}, clients)
			s := &Server{Handler: h}
			addr := startServer(t, s)
			answers := make(chan error, clients)
			for range clients {
				go func() { _, err := ask(network, addr, 5*time.Second); answers <- err }()
			}
			for i := range clients {
				select {
				case <-h.entered:
				case <-time.After(5 * time.Second):
					t.Fatalf("%d of %d queries reached the handler", i, clients)
				}
			}
			shut := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				shut <- s.Shutdown(ctx)
			}()
			h.release()
			for range clients {
				if err := <-answers; err != nil {
					t.Errorf("a query taken before Shutdown: %v", err)
				}
			}
			if err := <-shut; err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
		})
	}
}

// The answer that Shutdown waits for last is sent before the sockets close:
// a writer counts its query answered only once the answer is handed to the
// socket. (Over TCP the connection's reader waits for its answers anyway.)
// Each round loses the answer only when Shutdown wins a race of a few
// microseconds, so the test runs many.
func TestShutdownSendsTheLastUDPAnswer(t *testing.T) {
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not happen in 5s", what)
		}
	}
	for round := range 200 {
		h := newHolder()
		waiting := make(chan struct{})
		s := &Server{Handler: h, UDPSockets: 1, beforeIdle: func() { close(waiting) }}
		addr := startServer(t, s)
		answer := make(chan error, 1)
		go func() { _, err := ask("udp", addr, 5*time.Second); answer <- err }()
		wait(h.entered, "the query reaching the handler")
		shut := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			shut <- s.Shutdown(ctx)
		}()
		wait(waiting, "Shutdown waiting for the last answer")
		h.release()
		if err := <-answer; err != nil {
			t.Fatalf("round %d: the answer Shutdown waited for: %v", round, err)
		}
		if err := <-shut; err != nil {
			t.Fatalf("round %d: Shutdown: %v", round, err)
		}
	}
}
