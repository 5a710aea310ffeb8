package dnsserver

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// bigTXTOnly sizes a completer's answers: size bytes to TXT queries, the
// header and question to others.
func bigTXTOnly(size int) func(q *Query) int {
	return func(q *Query) int {
		if q.QType == dns.TypeTXT {
			return size
		}
		return 0
	}
}

// smallSendBuffer gives an accepted connection a send buffer of a few
// kilobytes: the kernel takes little of what the writer writes, as once a
// client that does not read has let it fill, so the answers beyond stay in
// the server's queue, where its bounds apply.
func smallSendBuffer(c *net.TCPConn) { c.SetWriteBuffer(4096) }

// lent returns the bytes the connections have borrowed from s's pool.
func lent(s *Server) int64 { return int64(s.TCPBurstBytes) - s.burst.free.Load() }

// queuedBytes returns the bytes of answers queued on s's open connections,
// and the most any one of them holds.
func queuedBytes(s *Server) (total, most int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for cc := range s.conns {
		cc.mu.Lock()
		total += cc.queued
		most = max(most, cc.queued)
		cc.mu.Unlock()
	}
	return total, most
}

// waitFlushed waits until every answer handed to comp so far is handed in.
func waitFlushed(t *testing.T, comp *completer) {
	t.Helper()
	select {
	case <-comp.flushed():
	case <-time.After(5 * time.Second):
		t.Fatal("the completing goroutine is still inside Write calls after 5s")
	}
}

// pipeline sends n queries for name and qtype on c, in one write, IDs from 1.
func pipeline(t *testing.T, c net.Conn, name string, qtype uint16, n int) {
	t.Helper()
	var flood []byte
	for i := range n {
		m := new(dns.Msg).SetQuestion(name, qtype)
		m.Id = uint16(i + 1)
		flood = append(flood, frame(t, m)...)
	}
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(flood); err != nil {
		t.Fatal(err)
	}
}

// waitTaken waits until comp has been handed n queries.
func waitTaken(t *testing.T, comp *completer, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for comp.taken.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d queries reached the handler in 5s, want %d", comp.taken.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A client that reads one byte a second is reading, barely: the room its
// burst borrowed beyond its share must not let it hold the server's memory
// any longer than a client that reads nothing. Its writer's deadline closes
// it, counted, everything it borrowed goes back to the pool, and other
// clients are answered meanwhile.
func TestAttackOneByteASecondReaderGivesBackItsBurst(t *testing.T) {
	const queries, size = 8, 60000
	comp := newCompleter(t, bigTXTOnly(size))
	var dropped reasons
	s := &Server{Handler: comp, TCPIdleTimeout: time.Minute, tcpWriteTimeout: 500 * time.Millisecond,
		OnDropped: dropped.add, accepted: smallSendBuffer}
	addr := startServer(t, s)

	c := dialSmallReadBuffer(t, addr)
	pipeline(t, c, "big.example.", dns.TypeTXT, queries)
	waitTaken(t, comp, queries)
	waitFlushed(t, comp)
	if n := dropped.count("tcp_slow_reader"); n != 0 {
		t.Fatalf("closed as a slow reader %d times before its writer could write: the burst itself was judged", n)
	}

	stop := make(chan struct{})
	reading := make(chan struct{})
	go func() {
		defer close(reading)
		buf := make([]byte, 1)
		for range 20 { // 20 s at most; the writer's deadline is 0.5 s
			c.SetReadDeadline(time.Now().Add(time.Second))
			if _, err := c.Read(buf); err != nil && !isTimeout(err) {
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Second): // the client's pace, not a wait for an event
			}
		}
	}()
	defer func() { close(stop); <-reading }()
	deadline := time.After(15 * time.Second)
	for dropped.count("tcp_slow_reader") == 0 {
		for _, network := range []string{"tcp", "udp"} {
			if r, err := ask(network, addr, 5*time.Second); err != nil || r.Rcode != dns.RcodeSuccess {
				t.Fatalf("another %s client, while one reads a byte a second: %v %v", network, r, err)
			}
		}
		select {
		case <-deadline:
			t.Fatalf("a client reading a byte a second was not closed in 15s (%d bytes lent)", lent(s))
		case <-time.After(10 * time.Millisecond):
		}
	}
	waitConns(t, s, 0)
	waitLent(t, s, 0)
	if n := dropped.count("tcp_slow_reader"); n != 1 {
		t.Errorf("OnDropped(tcp_slow_reader) called %d times, want 1", n)
	}
}

// waitConns waits until n connections are open on s.
func waitConns(t *testing.T, s *Server, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		open := len(s.conns)
		s.mu.Unlock()
		if open == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections open after 5s, want %d", open, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitAllDue waits until every connection open on s has n queries taken
// and comp has handed in every answer it was given: the answers of the
// connections still open are all queued, or written.
func waitAllDue(t *testing.T, s *Server, comp *completer, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		waitFlushed(t, comp)
		s.mu.Lock()
		short, open := 0, len(s.conns)
		for cc := range s.conns {
			if len(cc.pipeline) != n {
				short++
			}
		}
		s.mu.Unlock()
		// Every query due and handed to the completer, then every Write
		// it was handed returned: before, the Writes of the last queries to
		// fall due could still be on their way when the caller counted
		// what was queued (a CI run counted 0 of 8 connections closed).
		if short == 0 && comp.taken.Load() >= int64(open*n) {
			waitFlushed(t, comp)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 5s %d open connections have not %d queries due", short, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitLent waits until the connections have borrowed want bytes from the pool.
func waitLent(t *testing.T, s *Server, want int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for lent(s) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes lent from the pool after 5s, want %d", lent(s), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// Many connections that do not read, each keeping its queue just under a
// bound: under its share, they cost the pool nothing, and a reading client's
// burst still gets through; under the per-connection bound, they take the
// pool, and the server's answers queued on TCP never pass MaxTCPConns
// shares plus the pool: the ones that find it empty are closed, counted,
// and what they borrowed is given back. Other clients are answered
// throughout, and nothing stays lent once they are gone.
func TestAttackManyConnectionsJustUnderTheBound(t *testing.T) {
	for _, tc := range []struct {
		name    string
		conns   int
		answers int // each connection's, of 60,002 bytes queued
		pool    int
	}{
		// Two answers: 120,004 bytes, under the share of 131,074.
		{"just under the share", 40, 2, 0},
		// Seventeen: 1,020,034 bytes, under the bound of 1,048,592; the
		// pool, 2 MiB, lends to two of them in full.
		{"just under the connection's bound", 8, 17, 2 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 60000
			burst := &burster{n: 8, size: size}
			comp := newCompleter(t, bigTXTOnly(size))
			var dropped reasons
			s := &Server{TCPIdleTimeout: time.Minute, tcpWriteTimeout: time.Minute, TCPBurstBytes: tc.pool,
				OnDropped: dropped.add, accepted: smallSendBuffer,
				Handler: HandlerFunc(func(w ResponseWriter, q *Query) {
					if q.QType == dns.TypeMX { // the reading client's

						burst.ServeDNS(w, q)
						return
					}
					comp.ServeDNS(w, q)
				})}
			t.Cleanup(burst.wg.Wait)
			addr := startServer(t, s)

			var attackers []*net.TCPConn
			for range tc.conns {
				c := dialSmallReadBuffer(t, addr)
				pipeline(t, c, "hold.example.", dns.TypeTXT, tc.answers)
				attackers = append(attackers, c)
			}
			waitAllDue(t, s, comp, tc.answers)

			total, most := queuedBytes(s)
			bound := tc.conns*sendShareBytes + s.TCPBurstBytes
			if total > bound || most > sendQueueBytes {
				t.Errorf("%d bytes queued, %d on one connection; bounds %d and %d", total, most, bound, sendQueueBytes)
			}
			if lent(s) < 0 || lent(s) > int64(s.TCPBurstBytes) {
				t.Errorf("%d bytes lent from a pool of %d", lent(s), s.TCPBurstBytes)
			}
			closedSlow := dropped.count("tcp_slow_reader")
			s.mu.Lock()
			open := len(s.conns)
			s.mu.Unlock()
			t.Logf("%d bytes queued, %d lent, %d of %d connections closed as slow readers", total, lent(s), closedSlow, tc.conns)
			if tc.answers*(2+size) <= sendShareBytes {
				if closedSlow != 0 || lent(s) != 0 {
					t.Fatalf("connections within their share: %d closed, %d bytes lent; want none", closedSlow, lent(s))
				}
				// The pool is whole: a reading client's burst gets through.
				c := dialSmallReadBuffer(t, addr)
				c.SetDeadline(time.Now().Add(10 * time.Second))
				pipeline(t, c, "burst.example.", dns.TypeMX, burst.n)
				if ids := readAnswers(t, c, burst.n); len(ids) != burst.n {
					t.Fatalf("the reading client got answers to %v, want %d distinct", ids, burst.n)
				}
				if n := dropped.count("tcp_slow_reader"); n != 0 {
					t.Fatalf("the reading client was closed as a slow reader beside %d connections within their shares", tc.conns)
				}
			} else {
				full := s.TCPBurstBytes / (tc.answers*(2+size) - sendShareBytes)
				if closedSlow < tc.conns-full-1 || closedSlow+open < tc.conns {
					t.Errorf("%d closed as slow readers, %d open; want at least %d closed, the rest open",
						closedSlow, open, tc.conns-full-1)
				}
			}
			for _, network := range []string{"tcp", "udp"} {
				if r, err := ask(network, addr, 5*time.Second); err != nil || r.Rcode != dns.RcodeSuccess {
					t.Fatalf("another %s client beside %d connections that do not read: %v %v", network, tc.conns, r, err)
				}
			}
			for _, c := range attackers {
				c.SetLinger(0)
				c.Close()
			}
			waitLent(t, s, 0)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown: %v (%d queries still pending)", err, s.Unanswered())
			}
			if n := s.Unanswered(); n != 0 {
				t.Fatal(fmt.Sprintf("%d queries pending after Shutdown", n))
			}
		})
	}
}
