package upstream

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// writeAnswer writes the answer to req on c as one frame.
func writeAnswer(t *testing.T, c net.Conn, req []byte) {
	a := packedAnswer(t, req)
	c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(a))), a...))
}

// One name the upstream never answers, while it answers every other at
// once on the same connection: the slow name's query, sent on a connection
// that has answered before, reaches its deadline, but the connection was
// delivering replies all along. It must not be
// taken for stalled: one connection carries everything, and every other
// query is answered.
func TestSlowNameKeepsAnAnsweringTCPConnection(t *testing.T) {
	var accepted atomic.Int32
	h := newHostilePair(t, func([]byte) [][]byte { return nil }, func(c *net.TCPConn) {
		accepted.Add(1)
		for {
			req, err := readFrame(c, 5*time.Second)
			if err != nil {
				return
			}
			m := new(dns.Msg)
			if m.Unpack(req) == nil && strings.HasPrefix(m.Question[0].Name, "slow") {
				continue
			}
			writeAnswer(t, c, req)
		}
	})
	const timeout = 300 * time.Millisecond
	u := newUpstream(t, Config{Addr: h.addr(), Timeout: timeout})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err := u.Exchange(ctx, q("first.example."), "tcp") // the slow query goes on an open connection
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	slow := make(chan error, 1)
	b, _ := q("slow.example.").Pack()
	u.Forward(b, "tcp", func(_, _ []byte, err error) { slow <- err })
	var slowErr error
	asked, failed := 0, 0
	end := time.Now().Add(5 * time.Second)
	for after := 0; after < 20 && time.Now().Before(end); asked++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := u.Exchange(ctx, q(fmt.Sprintf("f%d.example.", asked)), "tcp")
		cancel()
		if err != nil {
			failed++
			t.Logf("query %d: %v", asked, err)
		}
		select {
		case slowErr = <-slow:
			slow = nil
		default:
		}
		if slow == nil {
			after++ // a few more once the slow one is done
		}
	}
	if slow != nil {
		t.Fatalf("the slow query was not reported within 5s (%d others asked)", asked)
	}
	if !errors.Is(slowErr, ErrNameTimeout) {
		t.Errorf("the slow query ended with %v, want ErrNameTimeout", slowErr)
	}
	if failed > 0 || accepted.Load() != 1 {
		t.Errorf("%d of %d queries failed, %d connections: a connection that answers every other query was taken for stalled",
			failed, asked, accepted.Load())
	}
}

// The first connection streams frames that answer nothing — too short to
// be a reply, and the answer to each query it reads under a wrong ID —
// and no reply. Frames are not life: it must be failed as the silent one
// is, and from the third query on each is answered by a new connection.
func TestTCPConnectionFramingNoReplyIsStalled(t *testing.T) {
	var accepted atomic.Int32
	stop := make(chan struct{})
	h := newHostilePair(t, func([]byte) [][]byte { return nil }, func(c *net.TCPConn) {
		if accepted.Add(1) > 1 {
			for {
				req, err := readFrame(c, 5*time.Second)
				if err != nil {
					return
				}
				writeAnswer(t, c, req)
			}
		}
		var mu sync.Mutex // the two writers
		done := make(chan struct{})
		defer close(done)
		go func() {
			tk := time.NewTicker(10 * time.Millisecond)
			defer tk.Stop()
			for {
				select {
				case <-stop:
					c.Close()
					return
				case <-done:
					return
				case <-tk.C:
				}
				mu.Lock()
				c.Write([]byte{0, 3, 1, 2, 3})
				mu.Unlock()
			}
		}()
		for {
			req, err := readFrame(c, 5*time.Second)
			if err != nil {
				return
			}
			a := packedAnswer(t, req)
			a[0] ^= 0x55
			mu.Lock()
			c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(a))), a...))
			mu.Unlock()
		}
	})
	t.Cleanup(func() { close(stop) }) // runs before the pair's clean-up
	u := newUpstream(t, Config{Addr: h.addr(), Timeout: 300 * time.Millisecond})
	const n = 8
	var failed []int
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := u.Exchange(ctx, q(fmt.Sprintf("g%d.example.", i)), "tcp")
		cancel()
		if err != nil && i >= 2 {
			failed = append(failed, i)
		}
	}
	if len(failed) > 0 {
		t.Errorf("queries %v (of 2..%d) failed: they went down the connection that sends frames and no reply (%d connections opened)",
			failed, n-1, accepted.Load())
	}
}

// After one reply, the upstream's connection sends a tiny frame every
// 20 ms and never another reply. Only a reply renews the idle deadline: the
// proxy closes the connection TCPIdle after that reply, not never.
func TestTCPConnectionFramingNoReplyIdlesOut(t *testing.T) {
	ended := make(chan error, 1)
	stop := make(chan struct{})
	h := newHostilePair(t, func([]byte) [][]byte { return nil }, func(c *net.TCPConn) {
		req, err := readFrame(c, 5*time.Second)
		if err != nil {
			return
		}
		writeAnswer(t, c, req)
		var wg sync.WaitGroup
		done := make(chan struct{})
		wg.Go(func() {
			tk := time.NewTicker(20 * time.Millisecond)
			defer tk.Stop()
			for {
				select {
				case <-done:
					return
				case <-stop:
					return
				case <-tk.C:
				}
				if _, err := c.Write([]byte{0, 3, 1, 2, 3}); err != nil {
					return
				}
			}
		})
		_, err = readFrame(c, 5*time.Second) // the proxy sends nothing more: this ends when it closes
		close(done)
		wg.Wait()
		ended <- err
	})
	t.Cleanup(func() { close(stop) }) // runs before the pair's clean-up
	const idle = 300 * time.Millisecond
	u := newUpstream(t, Config{Addr: h.addr(), Timeout: time.Second, TCPIdle: idle})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := u.Exchange(ctx, q("i.example."), "tcp"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ended:
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the connection was still open 5s after its only reply, TCPIdle being %v: the frames kept it", idle)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream's handler did not end within 10s")
	}
}

// An upstream that gives no reply and closes each connection (at once,
// after reading one query, or with a reset): each query goes out again
// once, not again and again until its deadline, and is reported exactly
// once. With no reply given, the connections opened are at most one per
// query.
func TestUpstreamClosingUnansweredIsNotRedialledAgainAndAgain(t *testing.T) {
	for _, tc := range []struct {
		name  string
		close func(c *net.TCPConn)
	}{
		{"at once", func(c *net.TCPConn) { c.Close() }},
		{"after reading one", func(c *net.TCPConn) {
			readFrame(c, 5*time.Second)
			c.Close()
		}},
		{"with a reset", func(c *net.TCPConn) {
			readFrame(c, 5*time.Second)
			c.SetLinger(0)
			c.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var accepted atomic.Int32
			h := newHostilePair(t, func([]byte) [][]byte { return nil }, func(c *net.TCPConn) {
				accepted.Add(1)
				tc.close(c)
			})
			u := newUpstream(t, Config{Addr: h.addr(), Timeout: time.Second})
			const n = 10
			var reports [n]atomic.Int32
			var all sync.WaitGroup
			all.Add(n)
			answered := atomic.Int32{}
			for i := range n {
				b, _ := q(fmt.Sprintf("r%d.example.", i)).Pack()
				u.Forward(b, "tcp", func(_, reply []byte, err error) {
					if reports[i].Add(1) == 1 {
						all.Done()
					}
					if err == nil {
						answered.Add(1)
					}
				})
			}
			waitGroup(t, &all, 5*time.Second, "every query reported")
			u.Close() // no more dials from here on
			for i := range reports {
				if got := reports[i].Load(); got != 1 {
					t.Errorf("query %d reported %d times", i, got)
				}
			}
			if answered.Load() > 0 {
				t.Errorf("%d queries answered by an upstream that answers nothing", answered.Load())
			}
			if got := accepted.Load(); got > n {
				t.Errorf("%d connections for %d queries and no reply: the queries were sent again and again", got, n)
			}
			t.Logf("%d connections", accepted.Load())
		})
	}
}
