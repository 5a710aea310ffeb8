package upstream

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"dnsproxi/internal/batchio"
	"dnsproxi/internal/wire"
)

// Source ports are drawn from minPort-65535, every port a process may bind
// without privilege: 64,512 of them, 15.98 bits. A port found taken is
// replaced by another draw, portTries times at most.
const (
	minPort   = 1024
	portTries = 16
)

// errRetired turns a query away from a socket that has retired: the caller
// sends it on the socket that took its place.
var errRetired = errors.New("upstream: socket retired")

// udpSocket is one connected UDP socket on a random source port. Queries
// are filed under a random free ID; one reader hands each valid reply to
// its query and ignores everything else. It takes queries until it retires
// (see udpSlot), then only reads.
type udpSocket struct {
	u      *Upstream
	conn   *net.UDPConn
	writer *batchio.Writer
	reader *batchio.Reader
	done   chan struct{} // closed when the reader has stopped
	stop   chan struct{} // closed by close: a reader's pause ends (readerr.go)

	mu       sync.Mutex
	pending  pending
	rng      entropy   // IDs and 0x20 case
	known    []byte    // the question last answered exactly in a random case: what a probe asks (probe.go)
	sent     int       // queries it took
	expires  time.Time // when it retires at the latest
	last     time.Time // the latest deadline of a query it took: by then, drained
	rotating bool      // the query that reached a bound is opening the successor
	retired  bool      // takes no more queries
	closed   bool
}

// replyBufSize is the largest UDP reply read whole; a larger one (rare: a
// client asked for more than 8 KB with EDNS) is fetched again over TCP. The
// buffers are kept small for the garbage collector's sake: see dnsserver's
// udpBufSize.
const replyBufSize = 8192

// dialUDP opens a socket to raddr on a random source port.
func dialUDP(u *Upstream, raddr *net.UDPAddr, now time.Time) (*udpSocket, error) {
	conn, err := listenRandomPort(raddr, u.cfg.AvoidPorts)
	if err != nil {
		return nil, err
	}
	conn.SetReadBuffer(4 << 20)
	conn.SetWriteBuffer(4 << 20)
	r, err := batchio.NewReader(conn, batchio.MaxBatch, replyBufSize)
	if err != nil {
		conn.Close()
		return nil, err
	}
	w, err := batchio.NewWriter(conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	s := &udpSocket{u: u, conn: conn, writer: w, reader: r, done: make(chan struct{}), stop: make(chan struct{}), pending: make(pending),
		expires: now.Add(u.cfg.SocketLifetime)}
	if u.cfg.Queries != nil {
		u.cfg.Queries.Add(w)
	}
	go s.read()
	return s, nil
}

// listenRandomPort binds a source port drawn from crypto/rand and connects
// to raddr. The kernel's own choice would come from its ephemeral range
// (28,232 ports on Linux) in a sequence some kernels make guessable.
func listenRandomPort(raddr *net.UDPAddr, avoid []uint16) (*net.UDPConn, error) {
	var err error = syscall.EADDRINUSE // if every draw was a port to avoid
	for range portTries {
		port := minPort + int(cryptoUint64()%(65536-minPort))
		if slices.Contains(avoid, uint16(port)) {
			continue
		}
		var conn *net.UDPConn
		if conn, err = net.DialUDP("udp", &net.UDPAddr{Port: port}, raddr); err == nil {
			return conn, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) && !errors.Is(err, syscall.EACCES) {
			return nil, err
		}
	}
	return nil, err
}

// port returns the socket's source port.
func (s *udpSocket) port() int { return s.conn.LocalAddr().(*net.UDPAddr).Port }

// close stops the socket and ends every query still waiting on it.
func (s *udpSocket) close() {
	s.mu.Lock()
	if !s.closed {
		close(s.stop)
	}
	s.closed = true
	left := s.pending.takeAll(nil)
	s.mu.Unlock()
	if s.u.cfg.Queries != nil {
		s.u.cfg.Queries.Remove(s.writer)
	}
	s.writer.Close()
	s.conn.Close()
	<-s.done
	for _, c := range left {
		c.finish(nil, ErrClosed)
	}
}

// send files c under a random free ID, in a fresh random case if mix, and
// queues it for the writer. It reports whether c was the query that reached
// one of the socket's bounds: then the caller opens its successor.
func (s *udpSocket) send(c *call, mix bool, now time.Time) (rotate bool, err error) {
	flush := false
	s.mu.Lock()
	defer func() {
		s.mu.Unlock()
		if flush { // the system call outside the lock: the reader takes replies meanwhile
			s.writer.Flush()
		}
	}()
	if s.retired { // before closed: a retired socket closes once drained
		return false, errRetired
	}
	if s.closed {
		return false, ErrClosed
	}
	name := c.wire[wire.HeaderLen : wire.HeaderLen+len(c.name)]
	copy(name, c.name) // a query sent again starts from the caller's case
	c.mixed = mix && mixCase(name, &s.rng)
	if c.mixed && c.probe {
		bothCases(name)
	}
	c.suspect = false
	c.lastSent = now
	if err := s.pending.add(c, &s.rng); err != nil {
		return false, err
	}
	// Queued under the lock: once c is in the table, a reply or the sweeper
	// may finish and recycle it, and c.wire with it.
	if flush, err = s.writer.Queue(netip.AddrPort{}, c.wire); err != nil {
		delete(s.pending, wire.ID(c.wire))
		return false, err
	}
	s.sent++
	if c.deadline.After(s.last) {
		s.last = c.deadline
	}
	if !s.rotating && (s.sent >= s.u.cfg.SocketQueries || now.After(s.expires)) {
		s.rotating = true
		return true, nil
	}
	return false, nil
}

// keepUntil takes the socket back into service after it could not be
// replaced, until another SocketQueries queries or until t, whichever comes
// first: a full term when its successor could not be opened, until the
// socket before it has drained while that one still carries queries
// (udpSlot.rotate).
func (s *udpSocket) keepUntil(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rotating, s.sent, s.expires = false, 0, t
}

// carrying reports whether the socket has a query waiting for its reply,
// and the latest deadline of a query it took.
func (s *udpSocket) carrying() (bool, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending) > 0, s.last
}

// retire stops the socket taking queries; it goes on reading.
func (s *udpSocket) retire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.retired = true
}

// take looks reply up, as read at now. It returns the query reply ends, if
// any, with the verdict: replyAnswers or replyBare; replyLate for a reply after the
// query's deadline (answer or case changed: the caller ends it as the
// sweeper would); replyCaseChanged once 0x20 is off (the caller sends that
// query again); replyFolded for a reply in another case to a query (not a
// probe) of an upstream known to echo case (the caller fetches it over
// TCP). A query with a reply in another case stays in the table otherwise,
// and so does a probe: suspect reports the first such reply to a query,
// for the caller to start a probe series (case.go).
func (s *udpSocket) take(reply []byte, now time.Time) (c *call, v verdict, suspect bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := wire.ID(reply)
	if c = s.pending[id]; c == nil {
		return nil, replyForeign, false
	}
	v = c.match(reply)
	if v == replyCaseChanged {
		s.u.cases.mismatches.Add(1)
	}
	switch {
	case v == replyForeign:
		return nil, v, false
	case now.After(c.deadline):
		delete(s.pending, id)
		return c, replyLate, false
	case v == replyBare: // says nothing of case
		delete(s.pending, id)
		return c, v, false
	case v == replyAnswers:
		delete(s.pending, id)
		if c.mixed { // an exact echo, in time: a question the upstream answers, and how quickly
			s.known = append(s.known[:0], c.wire[wire.HeaderLen:c.qend]...)
			s.u.cases.quickest.add(now.Sub(c.lastSent))
		}
		return c, v, false
	case s.u.cases.plain.Load() && !c.probe:
		delete(s.pending, id)
		return c, v, false
	}
	if c.mixed { // in another case, in time: how quickly the upstream answers, if it never echoes (probe.go)
		s.u.cases.folded.add(now.Sub(c.lastSent))
	}
	suspect = !c.suspect && !c.probe
	if !c.probe && s.u.cases.echoes() { // a backend that folds, or a forger: over TCP (case.go)
		delete(s.pending, id)
		return c, replyFolded, suspect
	}
	c.suspect = true // a probe waits on for an exact reply that would overrule this one
	return nil, v, suspect
}

// appendKnownQuestion appends the question the socket last had answered
// exactly to q, if there is one.
func (s *udpSocket) appendKnownQuestion(q []byte) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append(q, s.known...)
}

// takeExpired removes the queries whose deadline is before now and appends
// them to out; drained reports whether the socket is retired and empty.
func (s *udpSocket) takeExpired(now time.Time, out []*call) (_ []*call, drained bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out = s.pending.takeExpired(now, out)
	return out, s.retired && len(s.pending) == 0
}

// takeSuspects removes the queries that had a reply in another case.
func (s *udpSocket) takeSuspects(out []*call) []*call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending.takeSuspects(out)
}

// read hands replies to their queries until the socket is closed. After a
// read error it reads on at once, or pauses as readErrors says.
func (s *udpSocket) read() {
	defer close(s.done)
	took := false
	serve := func(n int) {
		took = true
		s.serveReplies(n)
	}
	var errs readErrors
	var pause *time.Timer
	for {
		took = false
		err := s.reader.Serve(serve)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		d := errs.pause(err, took)
		if d == 0 {
			continue // an ICMP error, consumed by the read that reported it: the queries it was about time out
		}
		if pause == nil {
			pause = time.NewTimer(d)
		} else {
			pause.Reset(d)
		}
		select {
		case <-pause.C:
		case <-s.stop:
			pause.Stop()
			return
		}
	}
}

// serveReplies hands the n replies the socket's reader holds to their queries.
func (s *udpSocket) serveReplies(n int) {
	// One reading for the batch: every reply in it came in by now. A reply
	// read after its query's deadline is late even if it arrived just
	// before: as the sweeper would judge it, never more kindly.
	now := time.Now()
	held := s.u.cfg.Replies.Hold()
	for i := range n {
		reply := s.reader.Packet(i)
		if len(reply) < wire.HeaderLen {
			continue
		}
		c, v, suspect := s.take(reply, now)
		if suspect {
			s.u.startProbe()
		}
		switch {
		case c == nil:
		case v == replyLate:
			c.finishAt(now, nil, s.u.pastDeadline(c))
		case v == replyCaseChanged: // 0x20 is off now: again, in the caller's case, if paid (extra.go)
			if err := s.u.extraSend(c); err != nil {
				c.finishAt(now, nil, err)
				continue
			}
			s.u.cases.resends.Add(1)
			s.u.sendUDP(c, now)
		case v == replyFolded, s.reader.Truncated(i): // a folding backend or a forger (case.go), or larger than the buffer: over TCP, before the same deadline, if paid
			if err := s.u.extraSend(c); err != nil {
				c.finishAt(now, nil, err)
				continue
			}
			if v == replyFolded {
				s.u.cases.fetches.Add(1)
				c.fetched = true
			}
			c.unmix()
			s.u.forwardTCP(c)
		default: // an answer, TC set or not: a TC answer would not fit the client either
			s.u.markAnswered(now) // before done: the upstream answered in time
			c.finishAt(now, reply, nil)
		}
	}
	batchio.Release(held)
}
