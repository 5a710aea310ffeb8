// Package dnsserver serves DNS over UDP and TCP on one address with one
// handler. It reads UDP in batches on one socket per core, reads the header,
// the question and the OPT record of each query straight from the packet,
// hands what is malformed beyond its header to the handler marked as such
// (so every answer passes the handler's gates), bounds the queries
// awaiting an answer and the TCP connections open at once, closes a TCP
// connection without cutting the answers written to it (linger.go), and
// shuts down gracefully: it stops reading, waits for every query it took
// to be answered, then closes its sockets.
//
// A handler must not block: it answers through its ResponseWriter, then or
// later, from any goroutine, exactly once (Write or Drop).
package dnsserver

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/batchio"
	"dnsproxi/internal/wire"
)

// Defaults for the Server's zero fields.
const (
	DefaultMaxUnanswered  = 10000
	DefaultMaxTCPConns    = 1000
	DefaultTCPIdleTimeout = 10 * time.Second
	DefaultTCPPipeline    = 64
	writeTimeout          = 2 * time.Second
)

// ErrServerClosed is returned by Start on a server that was shut down.
var ErrServerClosed = errors.New("dnsserver: server closed")

// ErrAnswered is returned by a ResponseWriter's second Write.
var ErrAnswered = errors.New("dnsserver: query already answered")

// ErrUDPPortShared is returned by FocusUDP when sockets the server did not
// open held the UDP port with SO_REUSEPORT (a process of the same user)
// before it started: the first socket of the kernel's group is one of
// theirs, and steering every query to it would hand them all.
var ErrUDPPortShared = errors.New("dnsserver: the UDP port was shared before the server bound it")

// Query is one query as the handler gets it: the packet, and what the
// server read from it.
type Query struct {
	// Wire is the packet as the client sent it. Over UDP it is only valid
	// until ServeDNS returns: copy what you keep.
	Wire    []byte
	Net     string         // "udp" or "tcp"
	Client  netip.AddrPort // where it came from (an IPv4 address unmapped)
	Opcode  int
	QDCount int    // questions in the header; the proxy answers anything but 1 with FORMERR
	QEnd    int    // Wire[12:QEnd] is the question (12 when there is none)
	QType   uint16 // the question's type, when there is one
	UDPSize int    // the largest UDP answer the client takes: 512, or its EDNS size if larger
	EDNS    wire.EDNS
	// Signed marks a query that ends with a transaction signature (TSIG or
	// SIG(0)): it signs the client's hop with a key this server does not
	// hold.
	Signed bool
	// Malformed marks a query whose header reads but whose rest does not: a
	// question or record cut short, a second OPT record, a transaction
	// signature that is not the last record, bytes after the last record,
	// a UDP datagram larger than the server reads. The handler
	// answers it (FORMERR) or not, as its gates decide; only Wire's header,
	// Net, Client, Opcode and QDCount are sure, and QEnd if it is past 12.
	Malformed bool
}

// ResponseWriter answers one query: Write once, or Drop.
type ResponseWriter interface {
	// Write sends one whole message; the writer keeps a copy, not reply.
	Write(reply []byte) error
	// Drop ends the query without an answer.
	Drop()
}

// Handler answers queries. ServeDNS must not block; it may answer later.
type Handler interface {
	ServeDNS(w ResponseWriter, q *Query)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(w ResponseWriter, q *Query)

// ServeDNS calls f(w, q).
func (f HandlerFunc) ServeDNS(w ResponseWriter, q *Query) { f(w, q) }

// Server serves DNS over UDP and TCP on Addr with Handler. Set the fields,
// then call Start; the zero value of each optional field takes its default.
type Server struct {
	// Addr is the IP:port to listen on for both UDP and TCP. Port 0 picks a
	// free port (the same for both); LocalAddr tells which.
	Addr string
	// Handler answers every query the server could parse.
	Handler Handler
	// MaxUnanswered bounds the queries taken and not yet answered, over both
	// networks; a query beyond it is dropped over UDP and answered REFUSED
	// at once over TCP (default 10000).
	MaxUnanswered int
	// MaxTCPConns bounds the TCP connections open at once (default 1000).
	// With every slot taken, a new connection takes the place of the one
	// with no query unanswered whose last whole query (or opening) is the
	// oldest, among the 64 oldest, closing it; a query that arrives as it
	// is closed is not taken. If each of those 64 has a query unanswered,
	// the new connection is closed at once. A connection being closed
	// gives its slot back at once, then lingers up to a second for its
	// client to take its last answers and close: at most 64 at a time
	// until Shutdown, which lets each linger.
	MaxTCPConns int
	// TCPIdleTimeout closes a connection that has not delivered a whole query
	// for this long, including one stalled half-way through (default 10s).
	TCPIdleTimeout time.Duration
	// TCPPipeline bounds the queries awaiting an answer on one TCP
	// connection, until the answer is written; the server stops reading it
	// until one is (default 64). A connection that does not take its answers
	// is closed: when a write to it takes 2s, or when they pile up beyond
	// what it may queue (two of the largest answers, and up to sixteen with
	// room borrowed from TCPBurstBytes).
	TCPPipeline int
	// TCPBurstBytes bounds the answers all TCP connections together may
	// queue beyond their own share of two of the largest each (default
	// DefaultTCPBurstBytes, 4 MiB): room for a client that reads to have
	// several large answers complete at once. The answers queued on TCP
	// stay below MaxTCPConns × 131,074 bytes + TCPBurstBytes.
	TCPBurstBytes int
	// UDPSockets is how many UDP sockets share the port (SO_REUSEPORT), each
	// with its own reader (default GOMAXPROCS; 1 where the system lacks it).
	UDPSockets int
	// OnDropped, if set, is called with a reason for every packet or
	// connection the server answers itself or drops ("malformed": shorter
	// than a header, or a TCP length beyond 4096; "response", "overloaded",
	// "tcp_conn_limit", "tcp_idle_evicted", "tcp_slow_reader").
	OnDropped func(reason string)
	// Overloaded, if set, answers a TCP query beyond MaxUnanswered (REFUSED,
	// built as the handler builds its own answers); it must not block. Nil:
	// a bare REFUSED, with an OPT record if the query had one.
	Overloaded Handler
	// Writers, if set, gets the UDP sockets' writers while the server
	// serves: whoever hands out a batch of upstream replies holds it, so
	// that the answers to those queries leave together (batchio.Group).
	Writers *batchio.Group
	// Forwards, if set, is held while a UDP reader serves a batch of
	// queries: the writers the queries are forwarded through, so that
	// those forwarded together leave in one system call a socket.
	Forwards *batchio.Group

	udp        []*listenSocket
	udpShared  bool // others held the UDP port first: udp[0] is not the group's first
	focusMu    sync.Mutex
	focused    bool // FocusUDP(true) steers the port's group to udp[0]; under focusMu
	tcp        *net.TCPListener
	unanswered atomic.Int64  // queries taken, not yet answered
	connTokens chan struct{} // one token per open TCP connection
	closing    atomic.Bool
	burst      burstPool      // what the TCP connections may queue beyond their shares
	wg         sync.WaitGroup // readers, connections and their writers
	drained    atomic.Bool    // Shutdown has stopped every reader and waits for the last answer
	idle       chan struct{}  // closed by the answer that brings unanswered to zero once drained
	idleOnce   sync.Once

	mu        sync.Mutex
	conns     map[*clientConn]struct{}
	byQuery   connList                 // the same connections, by their last whole query
	lingering map[*clientConn]struct{} // connections in a graceful close, ≤ maxLingering
	abandoned bool                     // Shutdown is closing every connection: none starts to linger
	lingers   sync.WaitGroup           // the graceful closes under way
	forced    atomic.Uint64            // closes that could not linger: maxLingering were under way

	// Test seams, nil or zero outside tests.
	tcpWriteTimeout time.Duration      // how long one write to a client may take; default writeTimeout
	lingerTime      time.Duration      // how long a graceful close may take; default defaultLingerTime
	beforeArm       func()             // a connection's reader is about to arm its idle deadline
	afterRead       func()             // a connection's reader has read a whole query, not yet taken it
	afterWake       func()             // Shutdown has woken every connection's reader
	accepted        func(*net.TCPConn) // a client's connection is accepted, not yet served
	beforeIdle      func()             // Shutdown waits for the last answer
}

// Start binds UDP and TCP on s.Addr and serves in the background. It returns
// once both are listening.
func (s *Server) Start() error {
	if s.closing.Load() {
		return ErrServerClosed
	}
	if s.Handler == nil {
		return errors.New("dnsserver: no handler")
	}
	s.setDefaults()
	ap, err := netip.ParseAddrPort(s.Addr)
	if err != nil {
		return fmt.Errorf("dnsserver: listen address %q: %w", s.Addr, err)
	}
	if err := s.listen(ap); err != nil {
		return err
	}
	for _, u := range s.udp {
		if s.Writers != nil {
			s.Writers.Add(u.writer)
		}
		s.wg.Add(1)
		go s.serveUDP(u)
	}
	s.wg.Add(1)
	go s.serveTCP()
	return nil
}

func (s *Server) setDefaults() {
	if s.MaxUnanswered <= 0 {
		s.MaxUnanswered = DefaultMaxUnanswered
	}
	if s.MaxTCPConns <= 0 {
		s.MaxTCPConns = DefaultMaxTCPConns
	}
	if s.TCPIdleTimeout <= 0 {
		s.TCPIdleTimeout = DefaultTCPIdleTimeout
	}
	if s.TCPPipeline <= 0 {
		s.TCPPipeline = DefaultTCPPipeline
	}
	if s.TCPBurstBytes <= 0 {
		s.TCPBurstBytes = DefaultTCPBurstBytes
	}
	s.burst.free.Store(int64(s.TCPBurstBytes))
	if s.UDPSockets <= 0 {
		s.UDPSockets = runtime.GOMAXPROCS(0)
	}
	if !reusePortSupported {
		s.UDPSockets = 1
	}
	if s.tcpWriteTimeout <= 0 {
		s.tcpWriteTimeout = writeTimeout
	}
	if s.lingerTime <= 0 {
		s.lingerTime = defaultLingerTime
	}
	s.connTokens = make(chan struct{}, s.MaxTCPConns)
	s.conns = make(map[*clientConn]struct{})
	s.lingering = make(map[*clientConn]struct{})
	s.idle = make(chan struct{})
}

// listen binds the UDP sockets, then TCP on the same port. With port 0 the
// port UDP was given may be taken for TCP; then it tries another.
func (s *Server) listen(ap netip.AddrPort) error {
	for attempt := 0; ; attempt++ {
		socks, shared, err := listenUDP(ap, s.UDPSockets)
		if err != nil {
			return fmt.Errorf("dnsserver: %w", err)
		}
		bound := socks[0].conn.LocalAddr().(*net.UDPAddr).AddrPort()
		tcp, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(bound))
		if err == nil {
			s.udp, s.udpShared, s.tcp = socks, shared, tcp
			return nil
		}
		for _, u := range socks {
			u.close()
		}
		if ap.Port() != 0 || attempt == 10 {
			return fmt.Errorf("dnsserver: %w", err)
		}
	}
}

// LocalAddr returns the address the server listens on, once started.
func (s *Server) LocalAddr() netip.AddrPort {
	return s.udp[0].conn.LocalAddr().(*net.UDPAddr).AddrPort()
}

// FocusUDP(true) has the kernel deliver every UDP query to the first of
// the server's sockets; FocusUDP(false) spreads them over all of them again
// by client address, as at start. A proxy running its Go code on one thread
// answers sooner from one socket read in large batches than from several
// read in small ones, each reader waking the one thread on its own; with
// more threads, each socket's reader has its own (README, "CPU"). Queries
// already queued on another socket are still read and answered. Call it
// once the server listens; with one socket it does nothing. On a port that
// others held first it does nothing and returns ErrUDPPortShared; once
// Shutdown has begun, ErrServerClosed.
func (s *Server) FocusUDP(one bool) error {
	if len(s.udp) < 2 {
		return nil
	}
	if s.udpShared {
		return ErrUDPPortShared
	}
	s.focusMu.Lock()
	defer s.focusMu.Unlock()
	if s.closing.Load() {
		return ErrServerClosed // Shutdown has spread the queries again, for good
	}
	if err := focusUDP(s.udp[0].conn, one); err != nil {
		return fmt.Errorf("dnsserver: steering UDP queries: %w", err)
	}
	s.focused = one
	return nil
}

// spreadUDP gives the kernel its own spread back as the server stops. The
// program that steers the port belongs to the kernel's group, not to a
// socket: when sockets of another process joined the port after the server,
// the group outlives the server's sockets with it, and once udp[0] is
// closed, index 0 is one of theirs, which would get every query. Called
// with closing set, so that no FocusUDP steers again after it.
func (s *Server) spreadUDP() {
	s.focusMu.Lock()
	defer s.focusMu.Unlock()
	if s.focused {
		// An error leaves nothing better to do: the sockets close anyway.
		focusUDP(s.udp[0].conn, false)
		s.focused = false
	}
}

// Unanswered returns how many queries were taken and not yet answered.
func (s *Server) Unanswered() int { return int(s.unanswered.Load()) }

// Shutdown stops reading new queries, waits until every query taken has been
// answered (over TCP: until the answer is written), then closes the sockets.
// If ctx ends first it closes them anyway and returns ctx's error. It also
// waits, within ctx, for the graceful closes of TCP connections (linger.go),
// up to a second each; one still under way when ctx ends is cut short,
// which is no error: its answers were written, and its client had until
// then to take them. It spreads the UDP queries again first, if FocusUDP
// had focused them, and for good.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.closing.Swap(true) || s.udp == nil {
		return nil
	}
	s.spreadUDP() // before the readers stop: a share, not every query, for the port's other sockets
	s.tcp.Close()
	for _, u := range s.udp {
		u.conn.SetReadDeadline(time.Now()) // wakes the reader; writes still work
	}
	s.mu.Lock()
	for cc := range s.conns {
		cc.conn.SetReadDeadline(time.Now()) // its reader checks closing after arming its own
	}
	s.mu.Unlock()
	if s.afterWake != nil {
		s.afterWake()
	}

	stopped := make(chan struct{})
	go func() { s.wg.Wait(); close(stopped) }() // TCP readers stop once their answers are written
	err := waitOrDone(ctx, stopped)
	if err == nil {
		// No reader takes a query any more: unanswered only falls, and the
		// answer that brings it to zero closes idle.
		s.drained.Store(true)
		if s.unanswered.Load() > 0 {
			if s.beforeIdle != nil {
				s.beforeIdle()
			}
			err = waitOrDone(ctx, s.idle)
		}
	}
	if err == nil {
		// No reader is left to start a graceful close: s.lingers only falls.
		lingered := make(chan struct{})
		go func() { s.lingers.Wait(); close(lingered) }()
		waitOrDone(ctx, lingered)
	}
	for _, u := range s.udp {
		if s.Writers != nil {
			s.Writers.Remove(u.writer)
		}
		u.close()
	}
	s.mu.Lock()
	s.abandoned = true // a reader ending from now on closes its connection at once
	conns := make([]*clientConn, 0, len(s.conns))
	for cc := range s.conns {
		conns = append(conns, cc)
	}
	lingering := make([]*clientConn, 0, len(s.lingering))
	for cc := range s.lingering {
		lingering = append(lingering, cc)
	}
	s.mu.Unlock()
	for _, cc := range conns { // left only when ctx ended first
		cc.close("")
	}
	for _, cc := range lingering { // left only when ctx ended first
		cc.conn.Close() // its linger's read fails, and it ends at once
	}
	s.lingers.Wait() // none starts once abandoned is set
	return err
}

// waitOrDone waits until ch is closed or ctx ends, and returns ctx's error
// in the second case.
func waitOrDone(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// finished counts n queries as answered. While Shutdown waits for the last
// answer, the one that brings the count to zero wakes it.
func (s *Server) finished(n int) {
	if n > 0 && s.unanswered.Add(-int64(n)) == 0 && s.drained.Load() {
		s.idleOnce.Do(func() { close(s.idle) })
	}
}

func (s *Server) dropped(reason string) {
	if s.OnDropped != nil {
		s.OnDropped(reason)
	}
}

// ServePacket handles one packet as if it had arrived on the server over
// UDP: it parses it, drops it if it is not a query, and hands it to the
// handler otherwise, marked Malformed if only its header reads. The
// server's readers do the same for every packet; it is exported for fuzzing
// the parse step.
func (s *Server) ServePacket(w ResponseWriter, pkt []byte) {
	s.serve(w, new(Query), pkt, "udp", netip.AddrPort{})
}

// serve takes one packet from client that w answers, parsed into q (which
// the caller allocates with w, in one piece).
func (s *Server) serve(w ResponseWriter, q *Query, pkt []byte, network string, client netip.AddrPort) {
	if !s.parse(q, pkt, network) {
		w.Drop()
		return
	}
	q.Client = client
	s.dispatch(w, q)
}

// dispatch hands a query to the handler, unless the server holds too many
// unanswered. That bound protects the server's memory, not the upstream:
// over UDP a query beyond it is dropped, for an answer would be one more
// packet the entry gate never saw, sent to an address nobody checked; over
// TCP, where the handshake proved the address, it is REFUSED at once, for
// a dropped TCP query waits out its client's whole timeout.
func (s *Server) dispatch(w ResponseWriter, q *Query) {
	if s.MaxUnanswered > 0 && s.unanswered.Load() > int64(s.MaxUnanswered) {
		s.dropped("overloaded")
		if q.Net != "tcp" {
			w.Drop()
			return
		}
		if s.Overloaded != nil {
			s.Overloaded.ServeDNS(w, q)
			return
		}
		w.Write(refusal(q))
		return
	}
	s.Handler.ServeDNS(w, q)
}

// refusal is a bare REFUSED to q, with an OPT record (RFC 6891 §6.1.1) if q
// had one.
func refusal(q *Query) []byte {
	b := wire.AppendReply(make([]byte, 0, q.QEnd+11), q.Wire, q.QEnd, dns.RcodeRefused)
	if q.EDNS.Present {
		b = wire.AppendOPT(b, dns.MinMsgSize, 0, q.EDNS.DO, nil)
		wire.SetCounts(b, int(binary.BigEndian.Uint16(b[4:])), 0, 0, 1)
	}
	return b
}

// parse reads a query. It reports false, and counts why, for a packet that
// is not a query at all: too short for a header, or a response. A query
// that is not well-formed beyond its header is marked Malformed.
func (s *Server) parse(q *Query, pkt []byte, network string) bool {
	*q = Query{Wire: pkt, Net: network, QEnd: wire.HeaderLen, UDPSize: dns.MinMsgSize}
	if len(pkt) < wire.HeaderLen {
		s.dropped("malformed")
		return false
	}
	if wire.Flags(pkt)&wire.FlagQR != 0 {
		s.dropped("response") // never answer an answer: that is how loops start
		return false
	}
	q.Opcode = wire.Opcode(pkt)
	q.QDCount, _, _, _ = wire.Counts(pkt)
	if q.QDCount == 0 {
		// The handler answers FORMERR, with an OPT if the query's reads
		// (RFC 6891 §6.1.1; a cookie-only query has no question, RFC 7873 §5.4).
		if sec, ok := wire.ReadSections(pkt, wire.HeaderLen); ok {
			q.setEDNS(sec.OPT)
		}
		return true
	}
	end, ok := wire.QuestionEnd(pkt)
	if !ok {
		q.Malformed = true
		return true
	}
	q.QEnd, q.QType = end, wire.QType(pkt, end)
	if q.QDCount > 1 {
		// FORMERR too, with an OPT if the query's reads past its questions.
		if qend, ok := wire.QuestionsEnd(pkt, q.QDCount); ok {
			if sec, ok := wire.ReadSections(pkt, qend); ok {
				q.setEDNS(sec.OPT)
			}
		}
		return true
	}
	sec, ok := wire.ReadSections(pkt, end)
	if ok {
		q.setEDNS(sec.OPT) // bytes after it or not: its FORMERR carries an OPT too
		q.Signed = sec.SigStart != 0
	}
	if !ok || sec.End != len(pkt) || sec.SigMisplaced() {
		q.Malformed = true
	}
	return true
}

// setEDNS records the query's OPT record, if it has one, and the UDP size
// it offers.
func (q *Query) setEDNS(opt wire.EDNS) {
	q.EDNS = opt
	if opt.Present {
		q.UDPSize = max(opt.Size, dns.MinMsgSize)
	}
}

// clientOf returns the address a connection comes from, IPv4 unmapped.
func clientOf(c *net.TCPConn) netip.AddrPort {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}

// answer is the part of a ResponseWriter that counts queries in and out.
type answer struct {
	s        *Server
	answered atomic.Bool
}

func (a *answer) start(s *Server) { a.s = s; s.unanswered.Add(1) }

// claim reports whether this call is the one that answers. The caller then
// counts the query finished (Server.finished) once its answer is sent or
// dropped.
func (a *answer) claim() bool { return !a.answered.Swap(true) }

// finish reports whether this call is the one that answers, and if so
// counts the query finished at once.
func (a *answer) finish() bool {
	if !a.claim() {
		return false
	}
	a.s.finished(1)
	return true
}
