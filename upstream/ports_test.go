package upstream

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// Source ports come from the whole range above 1023, not from a few
// sockets the kernel placed in its ephemeral range.
func TestSourcePortsSpreadOverTheRange(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg { return []*dns.Msg{answer(req)} })
	var ports []int
	for range 16 {
		u, err := New(Config{Addr: srv.addr()})
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, portsInUse(u)...)
		u.Close()
	}
	var quarters [4]int
	for _, p := range ports {
		if p < 1024 {
			t.Fatalf("source port %d is below 1024", p)
		}
		quarters[(p-1024)*4/(65536-1024)]++
	}
	// 128 ports drawn uniformly: 32 expected per quarter; fewer than 12 is
	// four standard deviations away.
	for i, n := range quarters {
		if n < 12 {
			t.Errorf("%d ports: %v per quarter of 1024-65535; quarter %d has %d, want them spread over the range", len(ports), quarters, i, n)
			break
		}
	}
}

// portsInUse returns the source ports of every UDP socket open at the
// moment, retired ones included: what an attacker who found them all knows.
func portsInUse(u *Upstream) []int {
	var ports []int
	for _, sl := range u.socks {
		for _, s := range sl.sockets() {
			ports = append(ports, s.port())
		}
	}
	return ports
}

// Sockets rotate: after SocketQueries queries or SocketLifetime, a fresh
// socket on a fresh random port takes the old one's place. The retired
// socket, drained, closes at the sweeper's next tick; until then the slot
// retires no other (TestSlotHoldsOneRetiredSocketAtMost), so the queries
// here wait for it, each sweep a few milliseconds under this timeout.
func TestSourcePortsRotate(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg { return []*dns.Msg{answer(req)} })
	for _, tt := range []struct {
		name    string
		cfg     Config
		queries int
		ports   int // distinct ports at least
		perPort int // queries on one port at most
	}{
		// 100 sockets of 3 queries each; a port drawn twice (7% likely) carries 6.
		{"after 3 queries", Config{UDPSockets: 2, SocketQueries: 3}, 300, 95, 6},
		// Every socket is past its lifetime when its first query goes out: one query each.
		{"after 1ns", Config{UDPSockets: 1, SocketLifetime: time.Nanosecond}, 40, 36, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv.mu.Lock()
			clear(srv.ports)
			srv.mu.Unlock()
			cfg := tt.cfg
			cfg.Addr, cfg.Timeout = srv.addr(), 200*time.Millisecond
			u := newUpstream(t, cfg)
			for i := range tt.queries {
				if _, err := u.Exchange(context.Background(), q("a.example."), "udp"); err != nil {
					t.Fatal(err)
				}
				for deadline := time.Now().Add(5 * time.Second); len(portsInUse(u)) > cfg.UDPSockets; {
					if time.Now().After(deadline) {
						t.Fatalf("after query %d: a drained retired socket still open after 5s", i+1)
					}
					time.Sleep(time.Millisecond) // polling a condition, with a deadline
				}
			}
			srv.mu.Lock()
			defer srv.mu.Unlock()
			if len(srv.ports) < tt.ports {
				t.Errorf("%d queries came from %d ports, want %d at least", tt.queries, len(srv.ports), tt.ports)
			}
			for port, n := range srv.ports {
				if n > tt.perPort {
					t.Errorf("port %d carried %d queries, want %d at most", port, n, tt.perPort)
				}
			}
			if st := u.Stats(); st.Rotations < uint64(tt.ports) || st.RotationErrors != 0 {
				t.Errorf("%+v, want %d rotations at least and no error", st, tt.ports)
			}
		})
	}
}

// A retired socket takes no new query but keeps reading: every query it
// carries gets its answer, exactly once; then it closes. While it still
// carries queries the slot retires no other: the current socket serves on
// past its bound, so a slot holds two sockets at most, as the descriptor
// reserve counts (TestAttackRetiredSocketsPassTheUpstreamsReserve).
func TestRetiredSocketAnswersItsQueries(t *testing.T) {
	const queries = 100
	srv := newHeldServer(t, queries)
	u := newUpstream(t, Config{Addr: srv.addr().String(), Timeout: 10 * time.Second, UDPSockets: 1, SocketQueries: 10})
	reports := make([]atomic.Int32, queries)
	var wg sync.WaitGroup
	wg.Add(queries)
	for i := range queries {
		m := q(fmt.Sprintf("n%d.example.", i))
		b, _ := m.Pack()
		u.Forward(b, "udp", func(_, reply []byte, err error) {
			if err != nil {
				t.Errorf("query %d: %v", i, err)
			}
			if reports[i].Add(1) == 1 {
				wg.Done()
			}
		})
	}
	srv.waitSeen(t, 5*time.Second)
	if got := len(portsInUse(u)); got != 2 {
		t.Fatalf("%d sockets open with the %d queries waiting, want 2: the retired one holding the first 10 and the new one the rest", got, queries)
	}
	if st := u.Stats(); st.Rotations != 1 {
		t.Fatalf("%d rotations with the first retired socket still carrying its queries, want 1", st.Rotations)
	}
	srv.release()
	waitGroup(t, &wg, 5*time.Second, "every query answered")
	deadline := time.Now().Add(5 * time.Second)
	for len(portsInUse(u)) > 1 { // the sweeper closes the drained ones at its next tick
		if time.Now().After(deadline) {
			t.Fatalf("%d sockets still open 5s after their last answer, want the current one only", len(portsInUse(u)))
		}
		time.Sleep(10 * time.Millisecond)
	}
	u.Close() // every report has happened once Close returns
	for i := range reports {
		if n := reports[i].Load(); n != 1 {
			t.Errorf("query %d reported %d times", i, n)
		}
	}
}

// The round-robin counter wraps around without picking a socket out of
// range, on 32-bit platforms too (GOARCH=386 go test -run SocketIndex).
func TestSocketIndexWraps(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg { return []*dns.Msg{answer(req)} })
	u := newUpstream(t, Config{Addr: srv.addr(), UDPSockets: 3})
	u.next.Store(1<<31 - 2) // int(next) turns negative on 32 bits two queries from now
	for range 6 {
		if _, err := u.Exchange(context.Background(), q("a.example."), "udp"); err != nil {
			t.Fatal(err)
		}
	}
}
