package dnsserver

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// completer answers every query from one goroutine of its own, in arrival
// order, one Write after another: the way an upstream's reader completes the
// queries it forwarded. A Write that blocks holds up every answer behind it.
type completer struct {
	size  func(q *Query) int // the answer's size for q; 0: header and question only
	jobs  chan func()
	taken atomic.Int64
	wg    sync.WaitGroup
}

// newCompleter starts the completing goroutine; it stops when the test ends,
// after the servers started later (their cleanups run first).
func newCompleter(t *testing.T, size func(q *Query) int) *completer {
	t.Helper()
	c := &completer{size: size, jobs: make(chan func(), 10000)}
	c.wg.Go(func() {
		for job := range c.jobs {
			job()
		}
	})
	t.Cleanup(func() { close(c.jobs); c.wg.Wait() })
	return c
}

func (c *completer) ServeDNS(w ResponseWriter, q *Query) {
	reply := answerOfSize(q, c.size(q))
	c.taken.Add(1)
	c.jobs <- func() { w.Write(reply) }
}

// flushed returns a channel closed once every Write handed to the completer
// so far has returned.
func (c *completer) flushed() <-chan struct{} {
	done := make(chan struct{})
	c.jobs <- func() { close(done) }
	return done
}

// answerOfSize answers q with NOERROR and, to reach size bytes, TXT records.
func answerOfSize(q *Query, size int) []byte {
	reply := wire.AppendReply(nil, q.Wire, q.QEnd, dns.RcodeSuccess)
	if size <= len(reply) {
		return reply
	}
	m := new(dns.Msg)
	if err := m.Unpack(reply); err != nil {
		panic(err)
	}
	txt := string(make([]byte, 250))
	for m.Len() < size-300 {
		m.Answer = append(m.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: m.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET}, Txt: []string{txt}})
	}
	b, err := m.Pack()
	if err != nil {
		panic(err)
	}
	return b
}

// frame returns m packed with its TCP length prefix.
func frame(t *testing.T, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...)
}

// drainUntilClosed reads c until it fails; it reports whether the server
// closed it (rather than the deadline passing first).
func drainUntilClosed(c net.Conn, timeout time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(timeout))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

// dialSmallReadBuffer connects to addr with a receive buffer of a few
// kilobytes, set before connecting so the window it offers stays small.
func dialSmallReadBuffer(t *testing.T, addr string) *net.TCPConn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { setReadBuffer(fd, 2048) })
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// reasons counts OnDropped's calls by reason.
type reasons struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *reasons) add(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = make(map[string]int)
	}
	r.n[reason]++
}

func (r *reasons) count(reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[reason]
}

// A client that pipelines queries and never reads its answers must cost
// only itself: the goroutine completing queries never waits on its socket,
// other clients on both networks are answered while it stays connected, and
// the server closes it, counted, with every query on it accounted for.
func TestSlowTCPReaderCostsOnlyItself(t *testing.T) {
	tests := []struct {
		name         string
		pipeline     int
		queries      int
		answer       int // bytes in each of the slow client's answers
		writeTimeout time.Duration
	}{
		// 64 answers of 60 KB overflow the connection's send queue; the
		// long write timeout leaves the queue's bound alone to close it.
		{"its queue overflows", 0, 200, 60000, time.Minute},
		// 4 answers of 16 KB fit the queue: the write times out instead.
		{"its write times out", 4, 2000, 16000, 200 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			comp := newCompleter(t, func(q *Query) int {
				if q.QType == dns.TypeTXT {
					return tt.answer
				}
				return 0
			})
			var dropped reasons
			slowClosed := make(chan struct{}, 1)
			s := &Server{Handler: comp, TCPPipeline: tt.pipeline, TCPIdleTimeout: time.Minute,
				tcpWriteTimeout: tt.writeTimeout,
				OnDropped: func(reason string) {
					dropped.add(reason)
					if reason == "tcp_slow_reader" {
						select {
						case slowClosed <- struct{}{}:
						default: // a second call is counted, and fails the test below
						}
					}
				}}
			addr := startServer(t, s)

			bad := dialSmallReadBuffer(t, addr)
			var flood []byte
			for i := range tt.queries {
				m := new(dns.Msg).SetQuestion("big.example.", dns.TypeTXT)
				m.Id = uint16(i)
				flood = append(flood, frame(t, m)...)
			}
			bad.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if _, err := bad.Write(flood); err != nil {
				t.Fatal(err)
			}

			// Other clients ask, one query after another, until the server
			// closes the slow client; each is answered within 5s, which a
			// completer stuck behind the slow client's socket cannot do.
			deadline := time.After(15 * time.Second)
			for closed := false; !closed; {
				for _, network := range []string{"tcp", "udp"} {
					if r, err := ask(network, addr, 5*time.Second); err != nil || r.Rcode != dns.RcodeSuccess {
						t.Fatalf("another %s client, while a client that never reads is connected: %v %v", network, r, err)
					}
				}
				select {
				case <-slowClosed:
					closed = true
				case <-deadline:
					t.Fatalf("the slow client's connection was not closed in 15s (%d of its queries taken)", comp.taken.Load())
				default:
				}
			}
			select {
			case <-comp.flushed():
			case <-time.After(5 * time.Second):
				t.Fatal("the completing goroutine is still inside Write calls after 5s: it blocks on the slow client's socket")
			}
			if !drainUntilClosed(bad, 10*time.Second) {
				t.Fatal("OnDropped said the slow client was closed, but its connection is open")
			}
			if n := dropped.count("tcp_slow_reader"); n != 1 {
				t.Errorf("OnDropped(tcp_slow_reader) called %d times, want 1", n)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown: %v (%d queries still pending)", err, s.Unanswered())
			}
			if s.Unanswered() != 0 {
				t.Fatalf("%d queries pending after Shutdown", s.Unanswered())
			}
		})
	}
}

// Clients that go away with answers still due leave nothing behind: every
// query is counted answered exactly once, whether its answer was written,
// dropped by the handler, or handed in after its connection closed, and
// Shutdown finds nothing pending (TestMain checks no goroutine is left).
func TestTCPAnswersAccountedWhenClientsLeave(t *testing.T) {
	const clients, queries, reads = 20, 40, 10
	s := &Server{TCPPipeline: 8, Handler: HandlerFunc(func(w ResponseWriter, q *Query) {
		answerElsewhere(w, q)
	})}
	addr := startServer(t, s)
	var flood []byte
	for i := range queries {
		m := new(dns.Msg).SetQuestion("www.example.com.", dns.TypeA)
		m.Id = uint16(i) // every fourth is dropped by the handler
		flood = append(flood, frame(t, m)...)
	}
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			c.(*net.TCPConn).SetLinger(0) // leave with a reset, answers unread
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write(flood); err != nil {
				t.Error(err)
				return
			}
			conn := &dns.Conn{Conn: c}
			for range reads {
				if _, err := conn.ReadMsg(); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v (%d queries pending)", err, s.Unanswered())
	}
	if n := s.Unanswered(); n != 0 {
		t.Fatalf("%d queries pending after Shutdown", n)
	}
}

// paddedQuery returns a query of exactly size bytes, padded with EDNS
// padding (RFC 7830).
func paddedQuery(t *testing.T, size int) *dns.Msg {
	t.Helper()
	m := new(dns.Msg).SetQuestion("www.example.com.", dns.TypeA)
	m.SetEdns0(1232, false)
	pad := &dns.EDNS0_PADDING{}
	m.IsEdns0().Option = append(m.IsEdns0().Option, pad)
	pad.Padding = make([]byte, size-m.Len())
	if m.Len() != size {
		t.Fatalf("padded query of %d bytes, want %d", m.Len(), size)
	}
	return m
}

// A query over TCP is as small as one over UDP: a length beyond the cap
// closes the connection before its body is read, and is counted.
func TestTCPQueryTooLarge(t *testing.T) {
	tests := []struct {
		name     string
		length   int
		answered bool
	}{
		{"at the cap", udpBufSize, true},
		{"one byte beyond", udpBufSize + 1, false},
		{"the largest a length can say", 65535, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var dropped reasons
			addr := startServer(t, &Server{TCPIdleTimeout: time.Minute, OnDropped: dropped.add})
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if tt.answered {
				conn := &dns.Conn{Conn: c}
				conn.SetDeadline(time.Now().Add(5 * time.Second))
				if err := conn.WriteMsg(paddedQuery(t, tt.length)); err != nil {
					t.Fatal(err)
				}
				if r, err := conn.ReadMsg(); err != nil || r.Rcode != dns.RcodeSuccess {
					t.Fatalf("a %d-byte query: %v %v", tt.length, r, err)
				}
				if n := dropped.count("malformed"); n != 0 {
					t.Errorf("OnDropped(malformed) called %d times for a query within the cap", n)
				}
				return
			}
			// Only the length: a server that waits for the body keeps the
			// connection for the whole idle timeout.
			c.Write(binary.BigEndian.AppendUint16(nil, uint16(tt.length)))
			if !closedByServer(c, 5*time.Second) {
				t.Fatalf("a length of %d kept the connection open", tt.length)
			}
			if n := dropped.count("malformed"); n != 1 {
				t.Errorf("OnDropped(malformed) called %d times, want 1", n)
			}
		})
	}
}

// stackEcho answers every query NOERROR from a buffer on its stack, as the
// proxy does, so that a benchmark's allocations are the server's own.
var stackEcho = HandlerFunc(func(w ResponseWriter, q *Query) {
	var buf [wire.HeaderLen + 260]byte
	w.Write(wire.AppendReply(buf[:0], q.Wire, q.QEnd, dns.RcodeSuccess))
})

// BenchmarkTCPPipelined measures one query and its answer over one
// pipelined TCP connection: the client writes b.N queries while it reads
// the answers. The client allocates nothing per query, so allocs/op is the
// server's (and the handler's, which answers from a stack buffer as the
// proxy does).
func BenchmarkTCPPipelined(b *testing.B) {
	s := &Server{Addr: "127.0.0.1:0", Handler: stackEcho}
	if err := s.Start(); err != nil {
		b.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	c, err := net.Dial("tcp", s.LocalAddr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	m := new(dns.Msg).SetQuestion("www.example.com.", dns.TypeA)
	q, err := m.Pack()
	if err != nil {
		b.Fatal(err)
	}
	query := append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)
	c.SetDeadline(time.Now().Add(time.Minute))
	b.ReportAllocs()
	b.ResetTimer()
	sent := make(chan error, 1)
	go func() {
		for range b.N {
			if _, err := c.Write(query); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	var lenBuf [2]byte
	buf := make([]byte, 65535)
	for range b.N {
		if _, err := io.ReadFull(c, lenBuf[:]); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf[:binary.BigEndian.Uint16(lenBuf[:])]); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-sent; err != nil {
		b.Fatal(err)
	}
}

// answerElsewhere answers q from another goroutine, as an upstream's reader
// does, and drops every fourth query (by its ID) unanswered instead.
func answerElsewhere(w ResponseWriter, q *Query) {
	reply := wire.AppendReply(nil, q.Wire, q.QEnd, dns.RcodeSuccess) // q.Wire is not ours to keep
	drop := q.Wire[1]%4 == 0
	go func() {
		if drop {
			w.Drop()
		} else {
			w.Write(reply)
		}
	}()
}
