package dnsserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// checkConnList reports what is wrong with s's list of connections, if
// anything: every open connection is in it once, linked both ways, and no
// more are open than MaxTCPConns.
func checkConnList(s *Server) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	var prev *clientConn
	for cc := s.byQuery.front; cc != nil; cc = cc.next {
		if n++; n > len(s.conns) {
			return fmt.Errorf("the list is longer than the %d open connections, or loops", len(s.conns))
		}
		if cc.prev != prev {
			return fmt.Errorf("connection %d in the list: its prev is not the one before it", n)
		}
		if _, ok := s.conns[cc]; !ok {
			return fmt.Errorf("connection %d in the list has ended", n)
		}
		prev = cc
	}
	if s.byQuery.back != prev {
		return errors.New("the list's back is not its last connection")
	}
	if n != len(s.conns) {
		return fmt.Errorf("%d connections in the list, %d open", n, len(s.conns))
	}
	if n > s.MaxTCPConns {
		return fmt.Errorf("%d connections open, MaxTCPConns is %d", n, s.MaxTCPConns)
	}
	return nil
}

// firstError keeps the first error reported to it, from any goroutine.
type firstError struct {
	mu  sync.Mutex
	err error
}

func (f *firstError) set(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

func (f *firstError) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// Many clients opening connections, asking, leaving half-way and being
// closed for one another, at once: the list of connections stays whole
// (checked at every query and every drop), no query is taken on a
// connection already closed for a newcomer, every query is answered exactly
// once (Shutdown finds none pending and every connection's pipeline
// drained), and Shutdown finishes whether the churn is over or still under
// way.
func TestTCPEvictionUnderChurn(t *testing.T) {
	tests := []struct {
		name      string
		maxConns  int
		shutAmid  bool // Shutdown while the clients still come
		clients   int
		rounds    int
		pipelined int
	}{
		{"one slot", 1, false, 8, 40, 2},
		{"eight slots", 8, false, 24, 40, 3},
		{"eight slots, shut down amid churn", 8, true, 24, 40, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var broken firstError
			var dropped reasons
			var handled atomic.Int64
			s := &Server{MaxTCPConns: tt.maxConns, TCPPipeline: 4, TCPIdleTimeout: time.Minute}
			s.OnDropped = func(reason string) {
				dropped.add(reason)
				if err := checkConnList(s); err != nil {
					broken.set(err)
				}
			}
			s.Handler = HandlerFunc(func(w ResponseWriter, q *Query) {
				handled.Add(1)
				s.mu.Lock()
				evicted := w.(*tcpWriter).conn.evicted.Load()
				s.mu.Unlock()
				if evicted {
					broken.set(errors.New("a query was taken on a connection already closed for a newcomer"))
				}
				if err := checkConnList(s); err != nil {
					broken.set(err)
				}
				answerElsewhere(w, q)
			})
			addr := startServer(t, s)

			var flood []byte
			for i := range tt.pipelined {
				m := new(dns.Msg).SetQuestion("churn.example.", dns.TypeA)
				m.Id = uint16(i + 1)
				flood = append(flood, frame(t, m)...)
			}
			halfway := make(chan struct{})
			var roundsDone atomic.Int64
			total := int64(tt.clients * tt.rounds)
			var wg sync.WaitGroup
			for client := range tt.clients {
				wg.Go(func() {
					for round := range tt.rounds {
						if roundsDone.Add(1) == total/2 {
							close(halfway)
						}
						c, err := net.Dial("tcp", addr)
						if err != nil {
							continue // after Shutdown
						}
						c.SetDeadline(time.Now().Add(5 * time.Second))
						switch (client + round) % 4 {
						case 0: // ask, read what comes back, leave
							c.Write(flood)
							conn := &dns.Conn{Conn: c}
							for range tt.pipelined {
								if _, err := conn.ReadMsg(); err != nil {
									break // closed for a newcomer between two queries
								}
							}
						case 1: // half a query, then leave
							c.Write(flood[:3])
						case 2: // ask and leave at once with a reset, answers unread
							c.(*net.TCPConn).SetLinger(0)
							c.Write(flood)
						case 3: // open and leave
						}
						c.Close()
					}
				})
			}
			if tt.shutAmid {
				select {
				case <-halfway:
				case <-time.After(10 * time.Second):
					t.Fatal("the clients did not get half-way in 10s")
				}
			} else {
				wg.Wait()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown: %v (%d queries pending)", err, s.Unanswered())
			}
			wg.Wait()
			if err := broken.get(); err != nil {
				t.Fatal(err)
			}
			if n := s.Unanswered(); n != 0 {
				t.Errorf("%d queries pending after Shutdown", n)
			}
			if err := checkConnList(s); err != nil {
				t.Error(err)
			}
			if len(s.conns) != 0 || len(s.connTokens) != 0 {
				t.Errorf("after Shutdown: %d connections open, %d slots taken", len(s.conns), len(s.connTokens))
			}
			if dropped.count("tcp_idle_evicted") == 0 {
				t.Error("no connection was closed for a newcomer: the test churned nothing")
			}
			t.Logf("%d queries taken, %d connections closed for newcomers, %d newcomers turned away",
				handled.Load(), dropped.count("tcp_idle_evicted"), dropped.count("tcp_conn_limit"))
		})
	}
}
