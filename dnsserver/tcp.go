package dnsserver

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// maxTCPQuery is the largest query read over TCP: the same as over UDP,
// since a query needs no more. A longer length closes the connection before
// its body is read, so a client cannot make the server hold 64 KiB a query.
const maxTCPQuery = udpBufSize

func (s *Server) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.tcp.AcceptTCP()
		if err != nil {
			if s.closing.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // out of file descriptors: let some close
			continue
		}
		select {
		case s.tcpSlots <- struct{}{}:
		default:
			s.dropped("tcp_conn_limit")
			c.Close()
			continue
		}
		s.mu.Lock()
		if s.closing.Load() {
			s.mu.Unlock()
			c.Close()
			<-s.tcpSlots
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serveConn(c)
	}
}

// tcpConn is one client connection. Queries are read in order and answered
// as they complete, at most TCPPipeline at a time.
type tcpConn struct {
	conn     *net.TCPConn
	mu       sync.Mutex    // serialises writes
	pipeline chan struct{} // one token per query awaiting its answer
}

// serveConn reads queries off one connection and hands each to the handler.
func (s *Server) serveConn(c *net.TCPConn) {
	defer s.wg.Done()
	tc := &tcpConn{conn: c, pipeline: make(chan struct{}, s.TCPPipeline)}
	defer func() {
		for range s.TCPPipeline { // wait for the answers still due on this connection
			tc.pipeline <- struct{}{}
		}
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
		<-s.tcpSlots
	}()
	var lenBuf [2]byte
	for !s.closing.Load() {
		// One deadline covers the length prefix and the body: a query that
		// stalls half-way costs its sender the connection, nobody else.
		c.SetReadDeadline(time.Now().Add(s.TCPIdleTimeout))
		if _, err := io.ReadFull(c, lenBuf[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(lenBuf[:]))
		if n < wire.HeaderLen || n > maxTCPQuery {
			s.dropped("malformed") // the body is never read: the stream cannot be trusted any more
			return
		}
		pkt := make([]byte, n)
		if _, err := io.ReadFull(c, pkt); err != nil {
			return
		}
		tc.pipeline <- struct{}{} // released by the answer
		w := &tcpWriter{conn: tc}
		w.start(s)
		s.serve(w, &w.q, pkt, "tcp")
	}
}

// tcpWriter answers one query on a connection.
type tcpWriter struct {
	answer
	conn *tcpConn
	q    Query
}

// Write sends one message with its length prefix.
func (w *tcpWriter) Write(b []byte) error {
	if !w.finish() {
		return ErrAnswered
	}
	defer func() { <-w.conn.pipeline }()
	if len(b) > dns.MaxMsgSize {
		return dns.ErrBuf
	}
	framed := make([]byte, 2+len(b))
	binary.BigEndian.PutUint16(framed, uint16(len(b)))
	copy(framed[2:], b)
	w.conn.mu.Lock()
	defer w.conn.mu.Unlock()
	w.conn.conn.SetWriteDeadline(time.Now().Add(writeTimeout)) // a client that never reads costs only itself
	_, err := w.conn.conn.Write(framed)
	return err
}

// Drop ends the query without an answer and frees its place on the connection.
func (w *tcpWriter) Drop() {
	if w.finish() {
		<-w.conn.pipeline
	}
}
