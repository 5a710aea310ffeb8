package dnsserver

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// lingeringConns returns how many connections are in a graceful close.
func (s *Server) lingeringConns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.lingering)
}

// waitFor polls cond until it holds, failing the test after 5s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A flood of connections, each closed for the next one, by clients that
// never close their side: each closed connection would linger, a goroutine
// and a socket each, for the whole linger time. At most maxLingering do;
// the rest are closed at once, so the goroutines stay within a reader and
// a writer per slot plus one per lingering close.
func TestEvictionFloodLingersAtMostMaxLingering(t *testing.T) {
	const slots = 2
	const flood = maxLingering + 30
	var dropped reasons
	s := &Server{MaxTCPConns: slots, TCPIdleTimeout: time.Minute, OnDropped: dropped.add, lingerTime: time.Minute}
	addr := startServer(t, s)
	before := runtime.NumGoroutine()
	for i := range slots + flood {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		// One at a time: each newcomer closes the one before it.
		waitFor(t, "the newcomer taking its slot", func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return len(s.conns) == min(i+1, slots) && dropped.count("tcp_idle_evicted") == max(0, i+1-slots)
		})
	}
	waitFor(t, "the evicted connections filling the lingering closes", func() bool {
		return s.lingeringConns() >= maxLingering
	})
	// Each lingers a minute: what is over the bound now stays over it.
	bound := 2*slots + maxLingering
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine()-before > bound {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines more after %d evictions, %d connections lingering: want at most %d (a reader and a writer per slot, one per lingering close)",
				runtime.NumGoroutine()-before, flood, s.lingeringConns(), bound)
		}
		time.Sleep(time.Millisecond)
	}
	if n := s.lingeringConns(); n != maxLingering {
		t.Fatalf("%d connections lingering after %d evictions, want %d", n, flood, maxLingering)
	}
}

// A client that keeps sending after its connection is closed does not
// keep the graceful close open: its deadline is set once, not moved by
// what it reads.
func TestLingerEndsAtItsDeadlineThoughTheClientKeepsSending(t *testing.T) {
	s := &Server{lingerTime: 200 * time.Millisecond}
	addr := startServer(t, s)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	// A length beyond any query: the server closes without reading on.
	if _, err := c.Write([]byte{0xff, 0xff}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the connection lingering", func() bool { return s.lingeringConns() == 1 })
	start := time.Now()
	chunk := make([]byte, 512)
	var werr error
	for werr == nil {
		_, werr = c.Write(chunk)
	}
	if isTimeout(werr) {
		t.Fatalf("the client sent for 5s and the server never closed: the linger outlives its %v", s.lingerTime)
	}
	waitFor(t, "the linger ending", func() bool { return s.lingeringConns() == 0 })
	t.Logf("the client's writes failed %v after the linger began: %v", time.Since(start).Round(time.Millisecond), werr)
}

// Shutdown waits for graceful closes only within its context: a client
// that never closes its side does not hold it past ctx, and its connection
// is closed when ctx ends. That is no error: its answers were written.
func TestShutdownCutsLingeringClosesAtItsDeadline(t *testing.T) {
	s := &Server{lingerTime: time.Minute}
	addr := startServer(t, s)
	c := dialAll(t, addr, 1)[0]
	if _, err := askOn(c, "q.example.", 3*time.Second); err != nil {
		t.Fatal(err)
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		shut <- s.Shutdown(ctx)
	}()
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown waited past its context for a connection to linger")
	}
	if n := s.lingeringConns(); n != 0 {
		t.Errorf("%d connections still lingering after Shutdown", n)
	}
	if !drainUntilClosed(c, 3*time.Second) {
		t.Fatal("the connection is still open after Shutdown")
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// At Shutdown every connection closes at once, more than maxLingering of
// them. Each client has sent its next query, which the server no longer
// reads, and reads its answer only after Shutdown returns: each must get
// it whole, none reset because the others took every lingering close.
func TestShutdownLingersEveryConnection(t *testing.T) {
	const clients = maxLingering + 8
	const size = 30000
	held := make(chan func(), clients)
	woken := make(chan struct{})
	s := &Server{
		Handler: HandlerFunc(func(w ResponseWriter, q *Query) {
			reply := bigAnswer(q.Wire, q.QEnd, size)
			held <- func() { w.Write(reply) }
		}),
		afterWake: func() { close(woken) },
	}
	addr := startServer(t, s)
	conns := make([]*net.TCPConn, clients)
	answers := make([]func(), clients)
	for i := range conns {
		conns[i] = dialSmallReadBuffer(t, addr)
		conns[i].SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := conns[i].Write(queryFrame(t, "q.example.")); err != nil {
			t.Fatal(err)
		}
		select {
		case answers[i] = <-held:
		case <-time.After(5 * time.Second):
			t.Fatalf("client %d's query did not reach the handler", i)
		}
	}
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut <- s.Shutdown(ctx)
	}()
	select {
	case <-woken:
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not wake the readers")
	}
	for i, c := range conns {
		if _, err := c.Write(queryFrame(t, "next.example.")); err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
	}
	for _, a := range answers {
		a()
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return")
	}
	errs := make(chan error, clients)
	for _, c := range conns {
		go func() {
			var l [2]byte
			if _, err := io.ReadFull(c, l[:]); err != nil {
				errs <- fmt.Errorf("reading its answer's length: %w", err)
				return
			}
			n, err := io.ReadFull(c, make([]byte, binary.BigEndian.Uint16(l[:])))
			if err != nil {
				err = fmt.Errorf("got %d of its answer's %d bytes, then %w", n, size, err)
			}
			errs <- err
		}()
	}
	lost := 0
	for range clients {
		if err := <-errs; err != nil {
			if lost++; lost == 1 {
				t.Errorf("a client: %v", err)
			}
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d clients lost their answer", lost, clients)
	}
}

// queryFrame is a query for name with its TCP length prefix.
func queryFrame(t *testing.T, name string) []byte {
	t.Helper()
	b, err := new(dns.Msg).SetQuestion(name, dns.TypeA).Pack()
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...)
}
