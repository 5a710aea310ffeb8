package upstream

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// The README promises that a port learned is good for at most its bound
// (SocketQueries, SocketLifetime) and one upstream timeout more: when the
// socket it replaced last still carries queries, the current socket serves
// on, but only until those have expired. A socket that reached its bound by
// count in a burst, while the socket before it waited on a silent name, and
// then saw the traffic fall, served on for another whole term: up to a
// minute by default, not a timeout.
func TestPortServesAtMostOneTimeoutPastItsBound(t *testing.T) {
	const timeout = 200 * time.Millisecond
	srv, u, wg := retireOnSilentNames(t, timeout)
	// Its successor reaches its bound while the first still waits: it serves on.
	second := u.socks[0].cur.Load()
	for range 3 {
		if _, err := u.Exchange(context.Background(), q("a.example."), "udp"); err != nil {
			t.Fatal(err)
		}
	}
	bound := time.Now()
	if u.socks[0].cur.Load() != second {
		t.Fatal("the second socket was replaced while the first still carried queries; the test expects it kept")
	}
	wg.Wait() // the silent queries have timed out
	for deadline := time.Now().Add(5 * time.Second); len(u.socks[0].sockets()) > 1; {
		if time.Now().After(deadline) {
			t.Fatal("the retired socket never closed after its queries expired")
		}
		time.Sleep(time.Millisecond) // polling a condition, with a deadline
	}
	for time.Since(bound) <= 2*timeout { // the event waited for is time itself passing
		time.Sleep(10 * time.Millisecond)
	}

	// One upstream timeout past its bound the port is done: the query that
	// finds it so may still leave from it, the next must not.
	for range 2 {
		if _, err := u.Exchange(context.Background(), q("b.example."), "udp"); err != nil {
			t.Fatal(err)
		}
	}
	srv.mu.Lock()
	n := srv.ports[second.port()]
	srv.mu.Unlock()
	if n > 4 {
		t.Fatalf("port %d carried %d queries, the last %v after it reached its bound of 3 (timeout %v): want 4 at most",
			second.port(), n, time.Since(bound).Round(time.Millisecond), timeout)
	}
}

// A socket kept past its bound may reach its count again while the socket
// before it still drains. Kept each time one timeout from then, it served
// up to two timeouts past its first bound; the queries it waits on were all
// sent before that bound, so it serves until the last of them expires.
func TestPortKeptTwiceServesAtMostOneTimeoutPastItsBound(t *testing.T) {
	const timeout = 300 * time.Millisecond
	srv, u, wg := retireOnSilentNames(t, timeout)
	second := u.socks[0].cur.Load()
	exchange := func(n int) {
		t.Helper()
		for range n {
			if _, err := u.Exchange(context.Background(), q("a.example."), "udp"); err != nil {
				t.Fatal(err)
			}
		}
	}
	exchange(3) // the second reaches its bound while the first drains: kept
	bound := time.Now()
	for time.Since(bound) < timeout/2 { // the event waited for is time itself passing
		time.Sleep(5 * time.Millisecond)
	}
	if len(u.socks[0].sockets()) < 2 {
		t.Skip("the first socket drained before the second reached its bound again; the machine is too slow for this timeline")
	}
	exchange(3) // its bound again, the first still draining: kept again
	if u.socks[0].cur.Load() != second {
		t.Fatal("the second socket was replaced while the first still carried queries; the test expects it kept")
	}
	wg.Wait()
	for time.Since(bound) <= timeout+timeout/4 { // the event waited for is time itself passing
		time.Sleep(5 * time.Millisecond)
	}
	srv.mu.Lock()
	before := srv.ports[second.port()]
	srv.mu.Unlock()
	exchange(2) // the first may still leave from the second's port, the next must not
	srv.mu.Lock()
	n := srv.ports[second.port()]
	srv.mu.Unlock()
	if n > before+1 {
		t.Fatalf("port %d carried %d queries %v after it first reached its bound (timeout %v): want 1 at most",
			second.port(), n-before, time.Since(bound).Round(time.Millisecond), timeout)
	}
}

// retireOnSilentNames starts an upstream that never answers names starting
// with "silent" and a client of one socket bound to 3 queries, then sends
// three such names, one at a time so that all leave from the first socket:
// that socket reaches its bound and retires carrying them. It returns once
// the successor has taken its place (the third query opens it on its own
// goroutine, after it was sent), with wg counting the silent queries' calls.
func retireOnSilentNames(t *testing.T, timeout time.Duration) (*testServer, *Upstream, *sync.WaitGroup) {
	t.Helper()
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg {
		if strings.HasPrefix(strings.ToLower(req.Question[0].Name), "silent") {
			return nil
		}
		return []*dns.Msg{answer(req)}
	})
	u := newUpstream(t, Config{Addr: srv.addr(), UDPSockets: 1, SocketQueries: 3, SocketLifetime: time.Hour,
		Timeout: timeout, Disable0x20: true})
	seen := func() int {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.ids)
	}
	first := u.socks[0].cur.Load()
	wg := new(sync.WaitGroup)
	for i := range 3 {
		wg.Go(func() { u.Exchange(context.Background(), q(fmt.Sprintf("silent%d.example.", i)), "udp") })
		for deadline := time.Now().Add(5 * time.Second); seen() <= i; {
			if time.Now().After(deadline) {
				t.Fatalf("the upstream saw %d of the silent queries, want %d", seen(), i+1)
			}
			time.Sleep(time.Millisecond) // polling a condition, with a deadline
		}
	}
	for deadline := time.Now().Add(5 * time.Second); u.socks[0].cur.Load() == first; {
		if time.Now().After(deadline) {
			t.Fatal("the first socket reached its bound and was not replaced")
		}
		time.Sleep(time.Millisecond) // polling a condition, with a deadline
	}
	return srv, u, wg
}
