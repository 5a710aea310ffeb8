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
		if !s.takeConnSlot() {
			s.dropped("tcp_conn_limit")
			c.Close()
			continue
		}
		if s.accepted != nil {
			s.accepted(c)
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
		s.byQuery.pushBack(cc)
		s.mu.Unlock()
		s.wg.Add(2)
		go cc.send()
		go s.serveConn(cc)
	}
}

// evictWait bounds how long a new connection waits for the slot of the
// idle one closed for it. That slot frees as soon as the chosen
// connection's reader runs: it had no query unanswered when chosen, a
// query it reads after is not taken (serveConn), and it frees the slot
// before its graceful close (endConn).
const evictWait = 100 * time.Millisecond

// evictScan bounds how many connections, oldest first, a new one looks
// through for one to replace: a flood of new connections costs a bounded
// scan each, however many are open.
const evictScan = 64

// takeConnSlot takes a slot for a new connection. With every slot taken, it
// closes the connection with no query unanswered whose last whole query (or
// opening, if it has sent none) is the oldest, counted "tcp_idle_evicted",
// and takes its slot: connections left open and idle, or stalled half-way
// through a query, cannot keep TCP from new clients (RFC 7766 §6.2.3 lets a
// server close idle connections under pressure; a client reconnects). It
// reports false, closing nothing, when each of the evictScan oldest has a
// query unanswered.
func (s *Server) takeConnSlot() bool {
	select {
	case s.connTokens <- struct{}{}:
		return true
	default:
	}
	victim := s.idlest()
	if victim == nil {
		return false
	}
	s.dropped("tcp_idle_evicted")
	// Its reader sees evicted after arming its deadline, or wakes now; it
	// closes the connection (endConn).
	victim.conn.SetReadDeadline(time.Now())
	t := time.NewTimer(evictWait)
	defer t.Stop()
	select {
	case s.connTokens <- struct{}{}:
		return true
	case <-t.C:
		return false
	}
}

// idlest returns, and marks evicted, the oldest of the evictScan oldest
// connections that has no query unanswered and was not evicted before, or
// nil if there is none.
func (s *Server) idlest() *clientConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	cc := s.byQuery.front
	for range evictScan {
		if cc == nil {
			return nil
		}
		if !cc.evicted.Load() && len(cc.pipeline) == 0 {
			cc.evicted.Store(true)
			return cc
		}
		cc = cc.next
	}
	return nil
}

// serveConn reads queries off one connection and hands each to the handler,
// at most TCPPipeline of them awaiting their answers at a time. Once it
// stops reading (the client closed or idled, a bad length, Shutdown,
// eviction, or the connection failed), it waits for the answers still due,
// then closes the connection, gracefully if it can (endConn).
func (s *Server) serveConn(cc *clientConn) {
	s.readQueries(cc)
	lingering := s.endConn(cc)
	s.wg.Done() // a lingering close counts in s.lingers instead
	if lingering {
		s.linger(cc)
	}
}

// readQueries is serveConn's reading: it returns once it stops.
func (s *Server) readQueries(cc *clientConn) {
	c := cc.conn
	var lenBuf [2]byte
	for {
		if s.beforeArm != nil {
			s.beforeArm()
		}
		// One deadline covers the length prefix and the body: a query that
		// stalls half-way costs its sender the connection, nobody else.
		c.SetReadDeadline(time.Now().Add(s.TCPIdleTimeout))
		// Checked after arming: Shutdown sets closing, and eviction sets
		// evicted, then moves the deadline to now, so either this sees it
		// or the read wakes.
		if s.closing.Load() || cc.evicted.Load() {
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
		if s.afterRead != nil {
			s.afterRead()
		}
		cc.pipeline <- struct{}{} // given back once the answer is written, or never can be
		// Taken only if the connection was not chosen for a newcomer:
		// idlest chooses under mu, and only a connection whose pipeline is
		// empty, so either it saw this token, or this sees evicted.
		s.mu.Lock()
		evicted := cc.evicted.Load()
		if !evicted {
			s.byQuery.moveToBack(cc)
		}
		s.mu.Unlock()
		if evicted {
			<-cc.pipeline // not taken: nothing is due, the slot frees at once
			return
		}
		w := &tcpWriter{conn: cc}
		w.start(s)
		s.serve(w, &w.q, pkt, "tcp", clientOf(c))
	}
}
