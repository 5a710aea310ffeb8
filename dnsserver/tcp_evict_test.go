package dnsserver

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// askOn sends one query on c and reads its answer, within timeout.
func askOn(c net.Conn, name string, timeout time.Duration) (*dns.Msg, error) {
	m := new(dns.Msg).SetQuestion(name, dns.TypeA)
	conn := &dns.Conn{Conn: c}
	conn.SetDeadline(time.Now().Add(timeout))
	defer conn.SetDeadline(time.Time{})
	if err := conn.WriteMsg(m); err != nil {
		return nil, err
	}
	return conn.ReadMsg()
}

// dialAll opens n connections to addr, closed when the test ends.
func dialAll(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	cs := make([]net.Conn, n)
	for i := range cs {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		cs[i] = c
	}
	return cs
}

// With every slot taken, a new client is served in the place of the
// connection that has waited longest for a query without one unanswered:
// connections left open and idle, or stalled half-way through a query,
// cannot keep TCP from everyone else (RFC 7766 §6.2.3 lets a server close
// idle connections under pressure). Connections with a query unanswered are
// never closed for a newcomer.
func TestIdleTCPConnectionsGiveWayToNewClients(t *testing.T) {
	var dropped reasons
	s := &Server{MaxTCPConns: 3, TCPIdleTimeout: time.Minute, OnDropped: dropped.add}
	addr := startServer(t, s)
	held := dialAll(t, addr, 3)
	// held[0] has waited since it connected, half a query sent; held[1]
	// asked one after, held[2] last.
	held[0].Write([]byte{0})
	if r, err := askOn(held[1], "b.example.", 3*time.Second); err != nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("held[1]: %v %v", r, err)
	}
	if r, err := askOn(held[2], "c.example.", 3*time.Second); err != nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("held[2]: %v %v", r, err)
	}

	for i, want := range []int{0, 1} {
		waitNothingDue(t, s)
		c := dialAll(t, addr, 1)[0]
		if r, err := askOn(c, "new.example.", 3*time.Second); err != nil || r.Rcode != dns.RcodeSuccess {
			t.Fatalf("newcomer %d with every slot idle: %v %v", i, r, err)
		}
		if !closedByServer(held[want], 3*time.Second) {
			t.Fatalf("newcomer %d: held[%d], the idlest, is still open", i, want)
		}
	}
	if r, err := askOn(held[2], "c.example.", 3*time.Second); err != nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("held[2], busier than the two closed: %v %v", r, err)
	}
	if n := dropped.count("tcp_idle_evicted"); n != 2 {
		t.Errorf("OnDropped(tcp_idle_evicted) called %d times, want 2", n)
	}
	if n := dropped.count("tcp_conn_limit"); n != 0 {
		t.Errorf("OnDropped(tcp_conn_limit) called %d times, want 0", n)
	}
}

// Connections each waiting for an answer keep their slots: a newcomer is
// closed at once, counted, and every waiting query is answered.
func TestBusyTCPConnectionsKeepTheirSlots(t *testing.T) {
	var dropped reasons
	h := newHolder()
	addr := startServer(t, &Server{MaxTCPConns: 2, Handler: h, OnDropped: dropped.add})
	held := dialAll(t, addr, 2)
	holdOneEach(t, h, held)
	c := dialAll(t, addr, 1)[0]
	if !closedByServer(c, 3*time.Second) {
		t.Fatal("a connection beyond MaxTCPConns was kept open while every slot waits for an answer")
	}
	if n := dropped.count("tcp_conn_limit"); n != 1 {
		t.Errorf("OnDropped(tcp_conn_limit) called %d times, want 1", n)
	}
	h.release(true)
	for i, c := range held {
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		if r, err := (&dns.Conn{Conn: c}).ReadMsg(); err != nil || r.Rcode != dns.RcodeSuccess {
			t.Fatalf("held[%d]'s answer: %v %v", i, r, err)
		}
	}
	if n := dropped.count("tcp_idle_evicted"); n != 0 {
		t.Errorf("a busy connection was closed for a newcomer %d times", n)
	}
}

// A new connection looks through the evictScan oldest only: behind as many
// connections waiting for answers, an idle one is not found, and the
// newcomer is closed, so a flood of new connections costs a bounded scan
// each however many are open.
func TestEvictionScanIsBounded(t *testing.T) {
	var dropped reasons
	h := newHolder()
	h.entered = make(chan struct{}, evictScan)
	addr := startServer(t, &Server{MaxTCPConns: evictScan + 1, Handler: h, TCPIdleTimeout: time.Minute, OnDropped: dropped.add})
	busy := dialAll(t, addr, evictScan)
	holdOneEach(t, h, busy)
	idle := dialAll(t, addr, 1)[0] // the newest: behind every busy one
	c := dialAll(t, addr, 1)[0]
	if !closedByServer(c, 3*time.Second) {
		t.Fatal("the newcomer was kept open: the scan went past its bound")
	}
	if n := dropped.count("tcp_conn_limit"); n != 1 {
		t.Errorf("OnDropped(tcp_conn_limit) called %d times, want 1", n)
	}
	h.release(true)
	if r, err := askOn(idle, "idle.example.", 3*time.Second); err != nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("the idle connection behind the scan's bound: %v %v", r, err)
	}
}

// A query whose last byte arrives as its connection is chosen for a
// newcomer is not taken: the connection had none unanswered when it was
// chosen, so it is closed with nothing sent upstream on its behalf, and its
// slot frees at once for the newcomer. Taking it instead would keep the
// slot until its answer came (the newcomer turned away after waiting,
// the accept loop stalled meanwhile) and spend an upstream exchange on an
// answer nobody can receive.
func TestQueryReadAsItsConnectionIsEvictedIsNotTaken(t *testing.T) {
	read, resume := make(chan struct{}), make(chan struct{})
	evicted := make(chan struct{}, 1)
	var reads atomic.Int64
	var dropped reasons
	var mu sync.Mutex
	var names []string
	var held []func()
	s := &Server{
		MaxTCPConns:    1,
		TCPIdleTimeout: time.Minute,
		// Queries for old.example. wait, as for a slow upstream; others
		// are answered at once.
		Handler: HandlerFunc(func(w ResponseWriter, q *Query) {
			reply := wire.AppendReply(nil, q.Wire, q.QEnd, dns.RcodeSuccess)
			var m dns.Msg
			m.Unpack(q.Wire)
			mu.Lock()
			names = append(names, m.Question[0].Name)
			if m.Question[0].Name == "old.example." {
				held = append(held, func() { w.Write(reply) })
				mu.Unlock()
				return
			}
			mu.Unlock()
			w.Write(reply)
		}),
		OnDropped: func(reason string) {
			dropped.add(reason)
			if reason == "tcp_idle_evicted" {
				select {
				case evicted <- struct{}{}:
				default:
				}
			}
		},
		// The first query read waits here until its connection is evicted.
		afterRead: func() {
			if reads.Add(1) == 1 {
				close(read)
				<-resume
			}
		},
	}
	addr := startServer(t, s)
	t.Cleanup(func() { // before Shutdown, which waits for them
		mu.Lock()
		defer mu.Unlock()
		for _, answer := range held {
			answer()
		}
	})
	old := dialAll(t, addr, 1)[0]
	if err := (&dns.Conn{Conn: old}).WriteMsg(new(dns.Msg).SetQuestion("old.example.", dns.TypeA)); err != nil {
		t.Fatal(err)
	}
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			close(resume)
			t.Fatalf("%s did not happen in 5s", what)
		}
	}
	wait(read, "old's query being read")
	newcomer := dialAll(t, addr, 1)[0]
	wait(evicted, "old being closed for the newcomer")
	close(resume)

	if r, err := askOn(newcomer, "new.example.", 3*time.Second); err != nil || r.Rcode != dns.RcodeSuccess {
		t.Errorf("the newcomer, in the place of a connection closed for it: %v %v (OnDropped(tcp_conn_limit) %d times)",
			r, err, dropped.count("tcp_conn_limit"))
	}
	mu.Lock()
	defer mu.Unlock()
	for _, name := range names {
		if name == "old.example." {
			t.Errorf("the handler was given the query read as its connection was closed for a newcomer")
		}
	}
}

// waitNothingDue waits until no connection of s has a query unanswered. A
// client reads its answer the moment it is written, a moment before the
// writer counts it answered: until then its connection is busy, not idle.
func waitNothingDue(t *testing.T, s *Server) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		s.mu.Lock()
		due := 0
		for cc := range s.conns {
			due += len(cc.pipeline)
		}
		s.mu.Unlock()
		if due == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d queries still counted unanswered 3s after their answers were read", due)
		}
		time.Sleep(time.Millisecond)
	}
}

// holdOneEach sends one query on each of conns and waits until h holds it.
func holdOneEach(t *testing.T, h *holder, conns []net.Conn) {
	t.Helper()
	for i, c := range conns {
		m := new(dns.Msg).SetQuestion("held.example.", dns.TypeA)
		if err := (&dns.Conn{Conn: c}).WriteMsg(m); err != nil {
			t.Fatal(err)
		}
		select {
		case <-h.entered:
		case <-time.After(3 * time.Second):
			t.Fatalf("connection %d's query never reached the handler", i)
		}
	}
}
