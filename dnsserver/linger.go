package dnsserver

import (
	"io"
	"time"
)

// A healthy TCP connection is closed gracefully: it sends a FIN after its
// last answer, then reads and discards what its client still sends until
// the client closes its side or lingerTime has passed, then closes. Closing
// a socket with bytes unread in it resets the connection (RFC 1122
// §4.2.2.13), and a reset throws away whatever of the answers the client
// has not taken yet: a next query sent just before the close, never to be
// read, would be enough to cut the answers to the queries before it.

// defaultLingerTime bounds a graceful close: a client that neither closes
// its side nor stops sending is closed after it, whatever it sends.
const defaultLingerTime = time.Second

// maxLingering bounds the connections in a graceful close at once while
// the server serves. Each has freed its slot, so that a newcomer is not
// kept waiting for it, and keeps its reader goroutine and its socket;
// beyond the bound a connection is closed at once (reset, if its client's
// bytes are unread), which a flood of connections closed for newcomers
// reaches first.
// Once Shutdown has begun every connection may linger: no newcomer takes a
// slot any more, so the goroutines and sockets only fall.
const maxLingering = 64

// endConn waits until every query taken on cc is answered (written, or
// dropped with the connection), stops its writer, and frees its slot. It
// reports whether cc is to linger, counted in s.lingers; if not, it has
// closed cc: one closed already, one Shutdown has given up on, or one
// beyond maxLingering while the server serves.
func (s *Server) endConn(cc *clientConn) bool {
	for range s.TCPPipeline {
		cc.pipeline <- struct{}{}
	}
	open := cc.stop() // every answer is written: nothing more is sent
	s.mu.Lock()
	delete(s.conns, cc)
	s.byQuery.remove(cc)
	lingering := open && !s.abandoned && (len(s.lingering) < maxLingering || s.closing.Load())
	if lingering {
		s.lingering[cc] = struct{}{}
		s.lingers.Add(1)
	} else if open && !s.abandoned {
		s.forced.Add(1)
	}
	s.mu.Unlock()
	if !lingering {
		cc.conn.Close()
	}
	<-s.connTokens
	return lingering
}

// ForcedCloses returns how many connections were closed at once, without
// a graceful close, because maxLingering were already in one while the
// server served: a client with bytes unread got a reset, and may have lost
// the answers it had not read yet.
func (s *Server) ForcedCloses() uint64 { return s.forced.Load() }

// linger closes cc gracefully: a FIN after the answers already written,
// then what the client sends is read and thrown away until it closes its
// side, s.lingerTime passes, or Shutdown gives up on it. The deadline is
// set once: a client that keeps sending does not extend it.
func (s *Server) linger(cc *clientConn) {
	defer s.lingers.Done()
	c := cc.conn
	if c.CloseWrite() == nil {
		c.SetReadDeadline(time.Now().Add(s.lingerTime))
		io.Copy(io.Discard, c)
	}
	c.Close()
	s.mu.Lock()
	delete(s.lingering, cc)
	s.mu.Unlock()
}
