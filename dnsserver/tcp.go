package dnsserver

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"time"

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
		case s.connTokens <- struct{}{}:
		default:
			s.dropped("tcp_conn_limit")
			c.Close()
			continue
		}
		cc := newClientConn(s, c)
		s.mu.Lock()
		if s.closing.Load() {
			s.mu.Unlock()
			c.Close()
			<-s.connTokens
			return
		}
		s.conns[cc] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(2)
		go cc.send()
		go s.serveConn(cc)
	}
}

// serveConn reads queries off one connection and hands each to the handler,
// at most TCPPipeline of them awaiting their answers at a time. Once it
// stops reading (the client closed or idled, a bad length, Shutdown, or the
// connection failed), it waits for the answers still due, then closes.
func (s *Server) serveConn(cc *clientConn) {
	defer s.wg.Done()
	defer s.endConn(cc)
	c := cc.conn
	var lenBuf [2]byte
	for {
		if s.beforeArm != nil {
			s.beforeArm()
		}
		// One deadline covers the length prefix and the body: a query that
		// stalls half-way costs its sender the connection, nobody else.
		c.SetReadDeadline(time.Now().Add(s.TCPIdleTimeout))
		// Checked after arming: Shutdown sets closing, then moves the
		// deadline to now, so either this sees closing or the read wakes.
		if s.closing.Load() {
			return
		}
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
		cc.pipeline <- struct{}{} // given back once the answer is written, or never can be
		w := &tcpWriter{conn: cc}
		w.start(s)
		s.serve(w, &w.q, pkt, "tcp", clientOf(c))
	}
}

// endConn waits until every query taken on cc is answered (written, or
// dropped with the connection), then closes cc and frees its slot.
func (s *Server) endConn(cc *clientConn) {
	for range s.TCPPipeline {
		cc.pipeline <- struct{}{}
	}
	cc.close("")
	s.mu.Lock()
	delete(s.conns, cc)
	s.mu.Unlock()
	<-s.connTokens
}
