//go:build linux

package dnsserver

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// stallAfter is how long a lone query may go unanswered before the test
// calls it stalled: its client sends nothing else meanwhile.
const stallAfter = 3 * time.Second

// startOn starts s on addr, skipping the test where addr cannot be bound,
// and shuts it down at the end of the test.
func startOn(t *testing.T, s *Server, addr string) string {
	t.Helper()
	s.Addr = addr
	if s.Handler == nil {
		s.Handler = echo
	}
	if err := s.Start(); err != nil {
		t.Skipf("listen on %s: %v", addr, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return s.LocalAddr().String()
}

// setProcs sets GOMAXPROCS and returns what it was.
func setProcs(n int) int { return runtime.GOMAXPROCS(n) }

// exchange sends one query on c and waits for its answer, at most stallAfter.
func exchange(c *net.UDPConn, id uint16, buf []byte) error {
	m := new(dns.Msg)
	m.SetQuestion("www.example.com.", dns.TypeA)
	m.Id = id
	q, err := m.Pack()
	if err != nil {
		return err
	}
	if _, err := c.Write(q); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(stallAfter))
	for {
		n, err := c.Read(buf)
		if err != nil {
			return fmt.Errorf("query %d unanswered within %v (a stall: nothing else was sent): %w", id, stallAfter, err)
		}
		var r dns.Msg
		if r.Unpack(buf[:n]) == nil && r.Id == id {
			return nil
		}
	}
}

// Lone queries, each sent only once the last was answered, from many
// clients over several SO_REUSEPORT sockets, over IPv4 and IPv6, and with
// GOMAXPROCS at 1: every one is answered without another query coming to
// announce it. A reader that waited with a query queued would leave its
// client hanging here, since that client sends nothing more.
func TestServeAttackLoneQueriesOverEverySocket(t *testing.T) {
	for _, tt := range []struct {
		name, addr string
		sockets    int
		procs      int
	}{
		{"IPv4, 4 sockets", "127.0.0.1:0", 4, 0},
		{"IPv6, 4 sockets", "[::1]:0", 4, 0},
		{"IPv4, 1 socket", "127.0.0.1:0", 1, 0},
		{"IPv4, 2 sockets, GOMAXPROCS 1", "127.0.0.1:0", 2, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.procs > 0 {
				// Before Start: the readers are started under it.
				defer setProcs(setProcs(tt.procs))
			}
			addr := startOn(t, &Server{UDPSockets: tt.sockets}, tt.addr)
			ua, err := net.ResolveUDPAddr("udp", addr)
			if err != nil {
				t.Fatal(err)
			}
			const clients, queries = 24, 40
			var wg sync.WaitGroup
			errs := make(chan error, clients)
			var answered atomic.Int64
			for c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					conn, err := net.DialUDP("udp", nil, ua)
					if err != nil {
						errs <- err
						return
					}
					defer conn.Close()
					buf := make([]byte, 512)
					for i := range queries {
						if err := exchange(conn, uint16(c*queries+i), buf); err != nil {
							errs <- err
							return
						}
						answered.Add(1)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			if n := answered.Load(); n != clients*queries {
				t.Fatalf("%d answers, want %d", n, clients*queries)
			}
		})
	}
}

// Shutdown under a flood ends every reader and returns in time, as it did
// when the readers looped over Read: the readers now serve inside the
// socket's read, and Shutdown's deadline must still reach them between
// batches, full or short.
func TestServeAttackShutdownUnderFlood(t *testing.T) {
	for round := range 20 {
		s := &Server{UDPSockets: 2}
		addr := startOn(t, s, "127.0.0.1:0")
		ua, err := net.ResolveUDPAddr("udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var sent atomic.Int64
		var wg sync.WaitGroup
		m := new(dns.Msg)
		m.SetQuestion("www.example.com.", dns.TypeA)
		q, _ := m.Pack()
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				conn, err := net.DialUDP("udp", nil, ua)
				if err != nil {
					return
				}
				defer conn.Close()
				for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
					select {
					case <-stop:
						return
					default:
					}
					conn.Write(q)
					sent.Add(1)
				}
			}()
		}
		for deadline := time.Now().Add(5 * time.Second); sent.Load() < 500 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond) // polls the flood's progress; no event to wait on
		}
		shut := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			shut <- s.Shutdown(ctx)
		}()
		select {
		case err := <-shut:
			if err != nil {
				t.Fatalf("round %d: Shutdown under a flood: %v", round, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: Shutdown still running after 10 s under a flood", round)
		}
		close(stop)
		wg.Wait()
		if n := s.Unanswered(); n != 0 {
			t.Fatalf("round %d: %d queries unanswered after Shutdown", round, n)
		}
	}
}
