package dnsserver

import (
	"encoding/binary"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// keepSendBuffer is the largest send buffer a connection keeps between
// writes; a larger one, grown by a burst of big answers, goes back to the
// garbage collector.
const keepSendBuffer = 16 << 10

// errSlowReader ends an answer that would overflow its connection's queue
// (sendpool.go). In frames the queue is bounded by TCPPipeline: an answer
// keeps its query's place in the pipeline until it is written.
var errSlowReader = errors.New("dnsserver: client does not read its answers")

// clientConn is one client's TCP connection. Its reader takes queries in
// order (serveConn); their answers are sent as they complete by a writer of
// its own (send), so whoever completes a query — an upstream's reader, a
// deadline sweeper — only queues the answer and never waits on a client's
// socket.
type clientConn struct {
	s        *Server
	conn     *net.TCPConn
	pipeline chan struct{} // one token per query taken and not yet answered on the wire
	wake     chan struct{} // the writer has answers to send, or the connection closed

	// Guarded by the server's mu.
	prev, next *clientConn // in Server.byQuery

	// Set under the server's mu; read without it by the reader after arming.
	evicted atomic.Bool // chosen to close for a new connection: not chosen again, and takes no query

	mu       sync.Mutex
	out      []byte // answers waiting for the writer, each with its length prefix
	frames   int    // how many answers are in out
	queued   int    // bytes in out and in the write under way
	borrowed int    // bytes of queued beyond the share, taken from the server's pool
	closed   bool   // nothing more is sent; an answer handed in now is finished at once
}

func newClientConn(s *Server, c *net.TCPConn) *clientConn {
	return &clientConn{s: s, conn: c, pipeline: make(chan struct{}, s.TCPPipeline), wake: make(chan struct{}, 1)}
}

func (cc *clientConn) signal() {
	select {
	case cc.wake <- struct{}{}:
	default:
	}
}

// enqueue queues one answer for the writer. It never blocks: an answer the
// queue has no room for closes the connection instead.
func (cc *clientConn) enqueue(b []byte) error {
	cc.mu.Lock()
	if cc.closed {
		cc.mu.Unlock()
		cc.answered(1)
		return net.ErrClosed
	}
	if !cc.reserve(2 + len(b)) {
		cc.mu.Unlock()
		cc.close("tcp_slow_reader")
		cc.answered(1)
		return errSlowReader
	}
	cc.out = binary.BigEndian.AppendUint16(cc.out, uint16(len(b)))
	cc.out = append(cc.out, b...)
	cc.frames++
	cc.queued += 2 + len(b)
	cc.mu.Unlock()
	cc.signal()
	return nil
}

// send writes the queued answers, all that have gathered in one write, until
// the connection closes. A write that fails, or takes longer than the write
// timeout, closes the connection: a client that does not read costs only
// itself, and a frame cut half-way is never followed by another.
func (cc *clientConn) send() {
	defer cc.s.wg.Done()
	var batch []byte
	for range cc.wake {
		cc.mu.Lock()
		if cc.closed {
			cc.mu.Unlock()
			return
		}
		batch, cc.out = cc.out, batch[:0]
		n := cc.frames
		cc.frames = 0
		cc.mu.Unlock()
		if n == 0 {
			continue
		}
		cc.conn.SetWriteDeadline(time.Now().Add(cc.s.tcpWriteTimeout))
		_, err := cc.conn.Write(batch)
		cc.mu.Lock()
		cc.queued -= len(batch)
		cc.settle()
		cc.mu.Unlock()
		if err != nil {
			reason := "" // the client went away, or the connection was closed already
			if errors.Is(err, os.ErrDeadlineExceeded) {
				reason = "tcp_slow_reader"
			}
			cc.close(reason)
			cc.answered(n)
			return
		}
		cc.answered(n)
		if cap(batch) > keepSendBuffer {
			batch = nil
		}
	}
}

// close closes the connection at once, if it is open, and counts why
// unless reason is empty. The answers still queued are finished unsent, and
// so is every answer handed in from now on, so the server's counts stay
// right. Closing a socket with bytes unread in it resets the connection:
// this is for a connection that failed or does not read its answers; the
// reader ends a healthy one gracefully instead (endConn, linger).
func (cc *clientConn) close(reason string) {
	n, ok := cc.markClosed()
	if !ok {
		return
	}
	cc.conn.Close()
	if reason != "" {
		cc.s.dropped(reason)
	}
	cc.finishUnsent(n)
}

// stop ends the connection's sending as close does, but leaves its socket
// open for a graceful close. It reports whether the connection was open.
func (cc *clientConn) stop() bool {
	n, ok := cc.markClosed()
	if ok {
		cc.finishUnsent(n)
	}
	return ok
}

// markClosed marks the connection closed, once, and empties its queue: it
// returns how many answers were in it, and whether this call closed it.
func (cc *clientConn) markClosed() (int, bool) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.closed {
		return 0, false
	}
	cc.closed = true
	n := cc.frames
	cc.queued -= len(cc.out)
	cc.settle()
	cc.out, cc.frames = nil, 0
	return n, true
}

// finishUnsent lets the writer see the connection is closed, and counts
// the n answers that were queued as answered.
func (cc *clientConn) finishUnsent(n int) {
	cc.signal()
	cc.answered(n)
}

// answered counts n queries on the connection as answered: for the server,
// and for the pipeline, which lets the reader take as many more.
func (cc *clientConn) answered(n int) {
	cc.s.finished(n)
	for range n {
		<-cc.pipeline
	}
}

// tcpWriter answers one query on a connection.
type tcpWriter struct {
	answer
	conn *clientConn
	q    Query // allocated with the writer: one allocation per query, not two
}

// Write queues one message for the connection's writer; it never blocks.
// The query counts as answered once the message is written, or once the
// connection closes without it.
func (w *tcpWriter) Write(reply []byte) error {
	if !w.claim() {
		return ErrAnswered
	}
	if len(reply) > dns.MaxMsgSize {
		w.conn.answered(1)
		return dns.ErrBuf
	}
	return w.conn.enqueue(reply)
}

// Drop ends the query without an answer and frees its place on the connection.
func (w *tcpWriter) Drop() {
	if w.claim() {
		w.conn.answered(1)
	}
}
