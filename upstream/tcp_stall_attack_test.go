package upstream

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// The first TCP connection to the upstream goes bad without closing — it
// takes queries and answers none (a half-open connection, an upstream
// stuck on one connection), or it sends half of a reply and stops — while
// every later connection answers at once. Queries go one after the other,
// each waiting out its 300 ms deadline; the connection's idle timeout is
// the default 10 s. A connection that has let a query's whole deadline
// pass without delivering a single reply is not to be trusted with the
// next one: from the third query on, each must be answered (by a new
// connection), not sent down the silent one until it idles out 10 s later.
func TestStalledUpstreamTCPConnectionDoesNotTakeEveryQuery(t *testing.T) {
	for _, tc := range []struct {
		name string
		bad  func(c *net.TCPConn, stop <-chan struct{})
	}{
		{"silent", func(c *net.TCPConn, stop <-chan struct{}) {
			go func() { <-stop; c.Close() }()
			for {
				if _, err := readFrame(c, 10*time.Second); err != nil {
					return
				}
			}
		}},
		{"half a reply", func(c *net.TCPConn, stop <-chan struct{}) {
			go func() { <-stop; c.Close() }()
			req, err := readFrame(c, 10*time.Second)
			if err != nil {
				return
			}
			a := packedAnswer(t, req)
			f := binary.BigEndian.AppendUint16(nil, uint16(len(a)))
			c.Write(append(f, a[:len(a)/2]...))
			for {
				if _, err := readFrame(c, 10*time.Second); err != nil {
					return
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var accepted atomic.Int32
			stop := make(chan struct{})
			h := newHostilePair(t, func([]byte) [][]byte { return nil }, func(c *net.TCPConn) {
				if accepted.Add(1) == 1 {
					tc.bad(c, stop)
					return
				}
				for {
					req, err := readFrame(c, 10*time.Second)
					if err != nil {
						return
					}
					a := packedAnswer(t, req)
					c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(a))), a...))
				}
			})
			t.Cleanup(func() { close(stop) }) // runs before the pair's clean-up
			u := newUpstream(t, Config{Addr: h.addr(), Timeout: 300 * time.Millisecond, TCPIdle: DefaultTCPIdle})
			const n = 8
			var failed []int
			for i := range n {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err := u.Exchange(ctx, q(fmt.Sprintf("s%d.example.", i)), "tcp")
				cancel()
				if err != nil {
					if i >= 2 {
						failed = append(failed, i)
					}
					if !errors.Is(err, ErrTimeout) && !errors.Is(err, errConnLost) {
						t.Logf("query %d: %v", i, err)
					}
				}
			}
			if len(failed) > 0 {
				t.Errorf("queries %v (of 2..%d) failed: every one went down the stalled connection although %d connection(s) were opened; the upstream answers on a new one at once",
					failed, n-1, accepted.Load())
			}
		})
	}
}

// An upstream that answers one query a connection and then closes it (RFC
// 7766 lets a server close a connection at any time; a client is to send
// what was left unanswered again). Ten queries go at once: each connection
// answers one of them, and each query left goes out again on the next.
// Sending again only once answered two of ten. Sending again without end
// answered all ten, at the price of n(n+1)/2 sends for n queries (55 for
// 10), which an upstream that reads on before closing answers with as many
// reads (TestTCPResendsPerQueryAreBounded): a query goes out maxSends
// times at most, so maxSends of the ten at least are answered here, one a
// connection (more if the first connection fails before the last query is
// forwarded), and the others end as lost connections (a failure, which the
// pool retries elsewhere), each reported once, within the deadline.
func TestUpstreamClosingAfterEachAnswerAnswersMaxSendsQueries(t *testing.T) {
	var accepted atomic.Int32
	h := newHostilePair(t, func([]byte) [][]byte { return nil }, func(c *net.TCPConn) {
		accepted.Add(1)
		req, err := readFrame(c, 5*time.Second)
		if err != nil {
			return
		}
		a := packedAnswer(t, req)
		c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(a))), a...))
		c.Close()
	})
	u := newUpstream(t, Config{Addr: h.addr(), Timeout: time.Second})
	const n = 10
	errs := make(chan error, n)
	for i := range n {
		b, _ := q(fmt.Sprintf("c%d.example.", i)).Pack()
		u.Forward(b, "tcp", func(_, _ []byte, err error) { errs <- err })
	}
	answered := 0
	for range n {
		select {
		case err := <-errs:
			switch {
			case err == nil:
				answered++
			case !errors.Is(err, errConnLost):
				t.Errorf("a query ended with %v, want an answer or a lost connection", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a query was not reported within 5s")
		}
	}
	if answered < maxSends {
		t.Errorf("%d of %d queries answered on %d connections, want %d at least: each query left goes out again on the next, %d times in all",
			answered, n, accepted.Load(), maxSends, maxSends)
	}
}
