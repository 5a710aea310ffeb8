package dnsserver

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// echo answers every query with NOERROR and its question.
var echo = dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(r)
	w.WriteMsg(m)
})

func startServer(t *testing.T, s *Server) string {
	t.Helper()
	s.Addr = "127.0.0.1:0"
	if s.Handler == nil {
		s.Handler = echo
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return s.LocalAddr().String()
}

func ask(network, addr string, timeout time.Duration) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion("www.example.com.", dns.TypeA)
	c := &dns.Client{Net: network, Timeout: timeout}
	r, _, err := c.Exchange(m, addr)
	return r, err
}

// closedByServer reports whether the server closes c before timeout.
func closedByServer(c net.Conn, timeout time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(timeout))
	_, err := c.Read(make([]byte, 1))
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err)
}

func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && !ne.Timeout()
}

func TestServesBothNetworksOnOnePort(t *testing.T) {
	addr := startServer(t, &Server{})
	for _, network := range []string{"udp", "tcp"} {
		if r, err := ask(network, addr, time.Second); err != nil || r.Rcode != dns.RcodeSuccess {
			t.Errorf("%s: %v %v", network, r, err)
		}
	}
}

func TestTCPStalledQueryIsClosed(t *testing.T) {
	addr := startServer(t, &Server{TCPIdleTimeout: 100 * time.Millisecond})
	for _, sent := range [][]byte{nil, {0}, {0, 40, 1, 2, 3}} { // nothing, half a length, half a body
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(sent)
		if !closedByServer(c, 3*time.Second) {
			t.Errorf("after sending %d bytes and stalling, the connection is still open", len(sent))
		}
		c.Close()
	}
}

func TestTCPConnectionCap(t *testing.T) {
	var dropped atomic.Int64
	s := &Server{MaxTCPConns: 2, OnDropped: func(string) { dropped.Add(1) }}
	addr := startServer(t, s)
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	// The two held connections still work...
	conn := &dns.Conn{Conn: held[0]}
	q := new(dns.Msg)
	q.SetQuestion("www.example.com.", dns.TypeA)
	conn.SetDeadline(time.Now().Add(3 * time.Second))
	if err := conn.WriteMsg(q); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.ReadMsg(); err != nil {
		t.Fatalf("a connection within the cap: %v", err)
	}
	// ...and a third is closed at once.
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !closedByServer(c, 3*time.Second) {
		t.Fatal("a connection beyond MaxTCPConns was kept open")
	}
	if dropped.Load() != 1 {
		t.Errorf("OnDropped called %d times, want 1", dropped.Load())
	}
	if r, err := ask("udp", addr, time.Second); err != nil || r.Rcode != dns.RcodeSuccess {
		t.Errorf("UDP while TCP is full: %v %v", r, err)
	}
}

// Hundreds of half-sent connections must not slow UDP clients down.
func TestSlowlorisDoesNotStarveUDP(t *testing.T) {
	addr := startServer(t, &Server{MaxTCPConns: 100, TCPIdleTimeout: 10 * time.Second})
	for range 300 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte{0}) // half a length prefix, then nothing
	}
	for i := range 20 {
		if r, err := ask("udp", addr, time.Second); err != nil || r.Rcode != dns.RcodeSuccess {
			t.Fatalf("UDP query %d under a slowloris: %v %v", i, r, err)
		}
	}
}

func TestHandlerCapAnswersRefused(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	entered := make(chan struct{}, 1)
	blocking := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		entered <- struct{}{}
		<-release
		echo(w, r)
	})
	addr := startServer(t, &Server{MaxHandlers: 1, Handler: blocking})
	go ask("udp", addr, 5*time.Second)
	<-entered
	for _, network := range []string{"udp", "tcp"} {
		r, err := ask(network, addr, time.Second)
		if err != nil || r.Rcode != dns.RcodeRefused {
			t.Fatalf("%s beyond MaxHandlers: %v %v, want REFUSED at once", network, r, err)
		}
	}
}

func TestTCPPipelineBound(t *testing.T) {
	var running, peak atomic.Int64
	release := make(chan struct{})
	slow := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		<-release
		running.Add(-1)
		echo(w, r)
	})
	addr := startServer(t, &Server{TCPPipeline: 2, Handler: slow})
	c, err := dns.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 5 {
		m := new(dns.Msg)
		m.SetQuestion("www.example.com.", dns.TypeA)
		m.Id = uint16(i + 1)
		c.WriteMsg(m)
	}
	deadline := time.Now().Add(2 * time.Second)
	for running.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // give a third handler the chance to start, if the bound were broken
	if p := peak.Load(); p != 2 {
		t.Fatalf("%d handlers ran at once on one connection, want the pipeline bound of 2", p)
	}
	close(release)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for range 5 {
		if _, err := c.ReadMsg(); err != nil {
			t.Fatalf("reading the pipelined answers: %v", err)
		}
	}
}

func TestShutdownFinishesQueriesInFlight(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 2)
	slow := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		entered <- struct{}{}
		<-release
		echo(w, r)
	})
	s := &Server{Addr: "127.0.0.1:0", Handler: slow}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	addr := s.LocalAddr().String()
	answers := make(chan error, 2)
	for _, network := range []string{"udp", "tcp"} {
		go func() { _, err := ask(network, addr, 5*time.Second); answers <- err }()
	}
	<-entered
	<-entered
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(context.Background()) }()
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned (%v) with handlers still running", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	for range 2 {
		if err := <-answers; err != nil {
			t.Errorf("a query in flight at shutdown: %v", err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := ask("udp", addr, 200*time.Millisecond); err == nil {
		t.Error("still answering UDP after Shutdown")
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Error("still accepting TCP after Shutdown")
	}
}

func TestFormErrHeader(t *testing.T) {
	tests := []struct {
		name string
		pkt  []byte
		want []byte
	}{
		{"short", []byte{1, 2, 3}, nil},
		{"a response", []byte{0, 7, 0x80, 0, 0, 1, 0, 0, 0, 0, 0, 0}, nil},
		{"query with RD and opcode", []byte{0xAB, 0xCD, 0x01 | 0x10, 0x20, 0, 1, 0, 0, 0, 0, 0, 0, 0xFF},
			[]byte{0xAB, 0xCD, 0x80 | 0x01 | 0x10, dns.RcodeFormatError, 0, 0, 0, 0, 0, 0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := formErr(tt.pkt)
			if string(got) != string(tt.want) {
				t.Fatalf("formErr = %x, want %x", got, tt.want)
			}
		})
	}
}
