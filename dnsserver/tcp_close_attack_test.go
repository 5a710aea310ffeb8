package dnsserver

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// bigAnswer is a reply to query padded to size bytes: what a DNSSEC answer
// of that size is to the server, a frame it must deliver whole.
func bigAnswer(query []byte, qend, size int) []byte {
	b := wire.AppendReply(make([]byte, 0, size), query, qend, dns.RcodeSuccess)
	return append(b, make([]byte, size-len(b))...)
}

// A pipelining client has queries answered while Shutdown runs, and has
// already sent its next query, which the server no longer reads. The
// client reads its answers a moment later. Shutdown promises that every
// query taken is answered, over TCP once the answer is written; but closing
// a socket with unread bytes in it resets the connection (RFC 1122
// §4.2.2.13), and a reset throws away whatever of the answers is still in
// the server's send buffer. The client must get every answer whole.
func TestShutdownDeliversAnswersDespiteUnreadNextQuery(t *testing.T) {
	for _, tc := range []struct {
		name    string
		queries int
		size    int
		rcvbuf  int // 0: the system's default
	}{
		{"one 60000-byte answer, 4 KiB receive buffer", 1, 60000, 4096},
		// Four answers of 30,000 bytes, not 60,000, to keep the test short:
		// through a 4 KiB window 240,000 bytes take seconds. (Handed in at
		// once they fit the queue: TestPipelinedBigAnswersReachAReadingClient.)
		{"four 30000-byte answers, 4 KiB receive buffer", 4, 30000, 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			held := make(chan func(), tc.queries)
			woken := make(chan struct{})
			s := &Server{
				Handler: HandlerFunc(func(w ResponseWriter, q *Query) {
					reply := bigAnswer(q.Wire, q.QEnd, tc.size)
					held <- func() { w.Write(reply) }
				}),
				afterWake: func() { close(woken) },
			}
			addr := startServer(t, s)
			raw, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			c := raw.(*net.TCPConn)
			defer c.Close()
			if tc.rcvbuf > 0 {
				c.SetReadBuffer(tc.rcvbuf)
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			frame := func(name string, id uint16) []byte {
				m := new(dns.Msg).SetQuestion(name, dns.TypeA)
				m.Id = id
				b, _ := m.Pack()
				return append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...)
			}
			var answers []func()
			for i := range tc.queries {
				if _, err := c.Write(frame("q.example.", uint16(i+1))); err != nil {
					t.Fatal(err)
				}
				select {
				case a := <-held:
					answers = append(answers, a)
				case <-time.After(5 * time.Second):
					t.Fatalf("query %d did not reach the handler", i+1)
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
			if _, err := c.Write(frame("next.example.", 100)); err != nil {
				t.Fatal(err)
			}
			for _, a := range answers {
				a()
			}
			if err := <-shut; err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			// Shutdown has returned: every answer counts as delivered. Read them.
			for i := range tc.queries {
				var l [2]byte
				if _, err := io.ReadFull(c, l[:]); err != nil {
					t.Fatalf("answer %d of %d: reading its length: %v", i+1, tc.queries, err)
				}
				body := make([]byte, binary.BigEndian.Uint16(l[:]))
				if n, err := io.ReadFull(c, body); err != nil {
					t.Fatalf("answer %d of %d: got %d of its %d bytes, then %v", i+1, tc.queries, n, len(body), err)
				}
			}
		})
	}
}

// A client had its query answered (60,000 bytes, written but not all
// taken by its small receive window yet), and its next query is on the
// way, not read yet, as its connection is chosen for a newcomer. The README
// promises that a query the server has read is never lost to eviction; the
// close resets a connection with unread bytes, and the reset throws away
// the rest of the answer. The client must get it whole.
func TestEvictionDeliversTheAnswerWritten(t *testing.T) {
	const size = 60000
	blocked, unblock := make(chan struct{}), make(chan struct{})
	var arms atomic.Int64
	s := &Server{
		MaxTCPConns:    1,
		TCPIdleTimeout: time.Minute,
		Handler: HandlerFunc(func(w ResponseWriter, q *Query) {
			w.Write(bigAnswer(q.Wire, q.QEnd, size))
		}),
		OnDropped: func(reason string) {
			if reason == "tcp_idle_evicted" {
				close(unblock)
			}
		},
		// The first connection's reader, back for its second query, waits
		// here until the connection is evicted: the second query stays in
		// the socket, as it does when it arrives just after the choice.
		beforeArm: func() {
			if arms.Add(1) == 2 {
				close(blocked)
				select {
				case <-unblock:
				case <-time.After(5 * time.Second):
				}
			}
		},
	}
	addr := startServer(t, s)
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	old := raw.(*net.TCPConn)
	defer old.Close()
	old.SetReadBuffer(4096)
	old.SetDeadline(time.Now().Add(5 * time.Second))
	frame := func(name string, id uint16) []byte {
		m := new(dns.Msg).SetQuestion(name, dns.TypeA)
		m.Id = id
		b, _ := m.Pack()
		return append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...)
	}
	if _, err := old.Write(frame("first.example.", 1)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-blocked:
	case <-time.After(5 * time.Second):
		t.Fatal("the reader did not come back for a second query")
	}
	waitNothingDue(t, s) // the answer is written: the connection is idle
	if _, err := old.Write(frame("second.example.", 2)); err != nil {
		t.Fatal(err)
	}
	newcomer, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer newcomer.Close()
	select {
	case <-unblock:
	case <-time.After(5 * time.Second):
		t.Fatal("the idle connection was not closed for the newcomer")
	}
	var l [2]byte
	if _, err := io.ReadFull(old, l[:]); err != nil {
		t.Fatalf("reading the first answer's length: %v", err)
	}
	body := make([]byte, binary.BigEndian.Uint16(l[:]))
	if n, err := io.ReadFull(old, body); err != nil {
		t.Fatalf("the first query, read and answered before its connection was chosen: got %d of its answer's %d bytes, then %v", n, len(body), err)
	}
}
