// Package dnsserver serves DNS over UDP and TCP on one address with one
// handler. It parses each query, answers what it cannot parse with FORMERR,
// bounds the handlers running at once and the TCP connections open at once,
// and shuts down gracefully: it stops reading, lets the handlers in flight
// write their answers, then closes its sockets.
package dnsserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// Defaults for the Server's zero fields.
const (
	DefaultMaxHandlers    = 10000
	DefaultMaxTCPConns    = 1000
	DefaultTCPIdleTimeout = 10 * time.Second
	DefaultTCPPipeline    = 64
	writeTimeout          = 2 * time.Second
)

// ErrServerClosed is returned by Start on a server that was shut down.
var ErrServerClosed = errors.New("dnsserver: server closed")

// Server serves DNS over UDP and TCP on Addr with Handler. Set the fields,
// then call Start; the zero value of each optional field takes its default.
type Server struct {
	// Addr is the host:port to listen on for both UDP and TCP. Port 0 picks
	// a free port (the same for both); Addr() tells which.
	Addr string
	// Handler answers every parsed query. It must not keep w after it returns.
	Handler dns.Handler
	// MaxHandlers bounds the handlers running at once over both networks;
	// a query beyond it is answered REFUSED at once (default 10000).
	MaxHandlers int
	// MaxTCPConns bounds the TCP connections open at once; a connection
	// beyond it is closed at once (default 1000).
	MaxTCPConns int
	// TCPIdleTimeout closes a connection that has not delivered a whole query
	// for this long, including one stalled half-way through (default 10s).
	TCPIdleTimeout time.Duration
	// TCPPipeline bounds the queries in flight on one TCP connection; the
	// server stops reading from it until one is answered (default 64).
	TCPPipeline int
	// UDPReaders is the number of goroutines reading the UDP socket
	// (default GOMAXPROCS).
	UDPReaders int
	// OnDropped, if set, is called with a reason for every packet or
	// connection the server answers itself or drops ("malformed",
	// "response", "overloaded", "tcp_conn_limit").
	OnDropped func(reason string)

	udp      *net.UDPConn
	tcp      *net.TCPListener
	handlers chan struct{} // one token per running handler
	tcpSlots chan struct{} // one token per open TCP connection
	closing  atomic.Bool
	wg       sync.WaitGroup // readers, connections and handlers

	mu    sync.Mutex
	conns map[*net.TCPConn]struct{}
}

// Start binds UDP and TCP on s.Addr and serves in the background. It returns
// once both sockets are listening.
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
	for range s.UDPReaders {
		s.wg.Add(1)
		go s.serveUDP()
	}
	s.wg.Add(1)
	go s.serveTCP()
	return nil
}

// listen binds UDP, then TCP on the same port. With port 0 the port UDP was
// given may be taken for TCP; then it tries another.
func (s *Server) listen(ap netip.AddrPort) error {
	for attempt := 0; ; attempt++ {
		udp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap))
		if err != nil {
			return fmt.Errorf("dnsserver: %w", err)
		}
		bound := udp.LocalAddr().(*net.UDPAddr).AddrPort()
		tcp, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(bound))
		if err == nil {
			s.udp, s.tcp = udp, tcp
			return nil
		}
		udp.Close()
		if ap.Port() != 0 || attempt == 10 {
			return fmt.Errorf("dnsserver: %w", err)
		}
	}
}

func (s *Server) setDefaults() {
	if s.MaxHandlers <= 0 {
		s.MaxHandlers = DefaultMaxHandlers
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
	if s.UDPReaders <= 0 {
		s.UDPReaders = runtime.GOMAXPROCS(0)
	}
	s.handlers = make(chan struct{}, s.MaxHandlers)
	s.tcpSlots = make(chan struct{}, s.MaxTCPConns)
	s.conns = make(map[*net.TCPConn]struct{})
}

// LocalAddr returns the address the server listens on, once started.
func (s *Server) LocalAddr() netip.AddrPort {
	return s.udp.LocalAddr().(*net.UDPAddr).AddrPort()
}

// Shutdown stops reading new queries, waits for the handlers in flight to
// answer, then closes the sockets. If ctx ends first it closes them anyway
// and returns ctx's error.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.closing.Swap(true) || s.udp == nil {
		return nil
	}
	s.tcp.Close()
	s.udp.SetReadDeadline(time.Now()) // wakes the readers; writes still work
	s.mu.Lock()
	for c := range s.conns {
		c.SetReadDeadline(time.Now())
	}
	s.mu.Unlock()

	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	s.udp.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	return err
}

// tryHandler takes a handler slot if one is free.
func (s *Server) tryHandler() bool {
	select {
	case s.handlers <- struct{}{}:
		return true
	default:
		return false
	}
}

func (s *Server) releaseHandler() { <-s.handlers }

func (s *Server) dropped(reason string) {
	if s.OnDropped != nil {
		s.OnDropped(reason)
	}
}

// ServePacket handles one packet as if it had arrived on the server: it
// parses it, answers FORMERR or drops it if it is not a query it can parse,
// and hands the query to the handler otherwise. The server's own readers
// call it; it is exported for fuzzing the parse step.
func (s *Server) ServePacket(w dns.ResponseWriter, pkt []byte) {
	if req := s.parse(w, pkt); req != nil {
		s.Handler.ServeDNS(w, req)
	}
}

// parse unpacks a query. It answers what it cannot parse itself and returns
// nil for it. The message it returns shares no memory with pkt.
func (s *Server) parse(w dns.ResponseWriter, pkt []byte) *dns.Msg {
	req := new(dns.Msg)
	if err := req.Unpack(pkt); err != nil {
		s.dropped("malformed")
		if hdr := formErr(pkt); hdr != nil {
			w.Write(hdr)
		}
		return nil
	}
	if req.Response {
		s.dropped("response") // never answer an answer: that is how loops start
		return nil
	}
	return req
}

// formErr returns a FORMERR header for a query whose header can be read,
// else nil. The question is not echoed: it could not be parsed.
func formErr(pkt []byte) []byte {
	if len(pkt) < 12 || pkt[2]&0x80 != 0 { // too short, or QR set: a response
		return nil
	}
	h := make([]byte, 12)
	h[0], h[1] = pkt[0], pkt[1] // the client's ID
	h[2] = 0x80 | pkt[2]&0x79   // QR, the opcode and RD
	h[3] = dns.RcodeFormatError // RA=0, Z=0, RCODE=FORMERR
	return h
}

// refuse answers a query REFUSED without parsing more than its header.
func refuse(pkt []byte) []byte {
	h := formErr(pkt)
	if h != nil {
		h[3] = dns.RcodeRefused
	}
	return h
}
