// Package fakeupstream is an authoritative-style DNS responder for tests and
// drills, on loopback only, that fails on command. It answers every name
// with fixed records, switches between modes at run time (ok, blackhole,
// slow, servfail, refused, truncate, flap), and counts every packet it
// receives so a test can prove what reached it.
//
// The zone: any A query gets 192.0.2.1, AAAA gets 2001:db8::1; a name whose
// first label is "nx" gets NXDOMAIN; a name whose first label is "big" gets
// TXT records of about 2 KB, truncated over UDP to the asker's size; a name
// whose first label is "slow" is answered after the Slow delay in any mode.
package fakeupstream

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// Mode is how the upstream behaves.
type Mode int

// The modes.
const (
	OK        Mode = iota // answer from the zone
	Blackhole             // read, never answer
	Slow                  // answer from the zone after Delay
	ServFail              // answer SERVFAIL
	Refused               // answer REFUSED
	Truncate              // over UDP an empty reply with TC set; over TCP the full answer
	Flap                  // alternate OK and Blackhole every FlapPeriod, starting OK
)

var modeNames = []string{"ok", "blackhole", "slow", "servfail", "refused", "truncate", "flap"}

// String returns the mode's name as ParseMode takes it.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// ParseMode returns the mode named s.
func ParseMode(s string) (Mode, error) {
	for i, n := range modeNames {
		if n == s {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("unknown mode %q: want one of %s", s, strings.Join(modeNames, ", "))
}

// Server is a fake upstream on UDP and TCP. Build it with Start.
type Server struct {
	udp *net.UDPConn
	tcp *net.TCPListener

	mode       atomic.Int64
	delay      atomic.Int64 // Slow: nanoseconds
	flapPeriod atomic.Int64 // Flap: nanoseconds
	flapStart  atomic.Int64 // Flap: unix nanoseconds of the first OK phase
	udpCount   atomic.Int64
	tcpCount   atomic.Int64

	// Script, if set, replaces the zone: it returns the raw packets to send
	// back for a query, in order (wrong IDs, garbage, duplicates...). It is
	// used in every mode but Blackhole.
	script atomic.Pointer[func(req *dns.Msg, network string) [][]byte]

	wg     sync.WaitGroup
	closed atomic.Bool
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
}

// Start listens on addr ("127.0.0.1:0" for any free port) in mode OK.
func Start(addr string) (*Server, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	if ip := ua.IP; ip != nil && !ip.IsLoopback() {
		return nil, fmt.Errorf("fakeupstream: %s is not a loopback address", addr)
	}
	udp, tcp, err := ListenPair(ua)
	if err != nil {
		return nil, err
	}
	s := &Server{udp: udp, tcp: tcp, conns: make(map[net.Conn]struct{})}
	s.delay.Store(int64(time.Second))
	s.flapPeriod.Store(int64(time.Second))
	s.wg.Add(2)
	go s.serveUDP()
	go s.serveTCP()
	return s, nil
}

// ListenPair binds UDP on ua and TCP on the same port. With port 0 the
// port UDP is given may be taken for TCP; then it tries another.
func ListenPair(ua *net.UDPAddr) (*net.UDPConn, *net.TCPListener, error) {
	for attempt := 0; ; attempt++ {
		udp, err := net.ListenUDP("udp", ua)
		if err != nil {
			return nil, nil, err
		}
		bound := udp.LocalAddr().(*net.UDPAddr)
		tcp, err := net.ListenTCP("tcp", &net.TCPAddr{IP: bound.IP, Port: bound.Port})
		if err == nil {
			return udp, tcp, nil
		}
		udp.Close()
		if ua.Port != 0 || attempt == 10 {
			return nil, nil, err
		}
	}
}

// Addr returns the host:port the server listens on.
func (s *Server) Addr() string { return s.udp.LocalAddr().String() }

// SetMode switches the behaviour for the packets that arrive from now on.
func (s *Server) SetMode(m Mode) {
	if m == Flap {
		s.flapStart.Store(time.Now().UnixNano())
	}
	s.mode.Store(int64(m))
}

// Mode returns the configured mode.
func (s *Server) Mode() Mode { return Mode(s.mode.Load()) }

// SetDelay sets how long Slow waits before answering.
func (s *Server) SetDelay(d time.Duration) { s.delay.Store(int64(d)) }

// SetFlapPeriod sets how long each OK and Blackhole phase of Flap lasts.
func (s *Server) SetFlapPeriod(d time.Duration) { s.flapPeriod.Store(int64(d)) }

// SetScript replaces the zone with fn (nil restores the zone).
func (s *Server) SetScript(fn func(req *dns.Msg, network string) [][]byte) {
	if fn == nil {
		s.script.Store(nil)
		return
	}
	s.script.Store(&fn)
}

// Received returns how many packets arrived over UDP and how many queries over TCP.
func (s *Server) Received() (udp, tcp int64) { return s.udpCount.Load(), s.tcpCount.Load() }

// Total returns every query received, both networks.
func (s *Server) Total() int64 { return s.udpCount.Load() + s.tcpCount.Load() }

// Close stops the server and waits for its goroutines.
func (s *Server) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.udp.Close()
	s.tcp.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// effectiveMode resolves Flap into the phase it is in now.
func (s *Server) effectiveMode() Mode {
	m := s.Mode()
	if m != Flap {
		return m
	}
	period := s.flapPeriod.Load()
	if period <= 0 {
		return OK
	}
	if (time.Now().UnixNano()-s.flapStart.Load())/period%2 == 0 {
		return OK
	}
	return Blackhole
}

// respond returns the packets to send for pkt over network, and how long to wait first.
func (s *Server) respond(pkt []byte, network string) ([][]byte, time.Duration) {
	mode := s.effectiveMode()
	if mode == Blackhole {
		return nil, 0
	}
	req := new(dns.Msg)
	if err := req.Unpack(pkt); err != nil || req.Response {
		return nil, 0
	}
	if fn := s.script.Load(); fn != nil {
		return (*fn)(req, network), 0
	}
	var delay time.Duration
	if mode == Slow || firstLabel(req) == "slow" {
		delay = time.Duration(s.delay.Load())
	}
	m := Answer(req)
	switch mode {
	case ServFail:
		m = rcodeReply(req, dns.RcodeServerFailure)
	case Refused:
		m = rcodeReply(req, dns.RcodeRefused)
	case Truncate:
		if network == "udp" {
			m.Answer, m.Ns, m.Extra = nil, nil, nil
			m.Truncated = true
		}
	}
	if network == "udp" && !m.Truncated {
		size := dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = max(size, int(opt.UDPSize()))
		}
		m.Truncate(size)
	}
	b, err := m.Pack()
	if err != nil {
		return nil, 0
	}
	return [][]byte{b}, delay
}

func rcodeReply(req *dns.Msg, rcode int) *dns.Msg {
	m := new(dns.Msg)
	m.SetRcode(req, rcode)
	return m
}

// Answer is the zone's answer to req.
func Answer(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if len(req.Question) != 1 {
		m.Rcode = dns.RcodeFormatError
		return m
	}
	q := req.Question[0]
	first := firstLabel(req)
	hdr := dns.RR_Header{Name: q.Name, Rrtype: q.Qtype, Class: dns.ClassINET, Ttl: 60}
	switch {
	case first == "nx":
		m.Rcode = dns.RcodeNameError
	case first == "big":
		hdr.Rrtype = dns.TypeTXT
		for i := range 20 {
			m.Answer = append(m.Answer, &dns.TXT{Hdr: hdr, Txt: []string{fmt.Sprintf("%02d %s", i, strings.Repeat("x", 96))}})
		}
	case q.Qtype == dns.TypeA:
		m.Answer = append(m.Answer, &dns.A{Hdr: hdr, A: net.IPv4(192, 0, 2, 1)})
	case q.Qtype == dns.TypeAAAA:
		m.Answer = append(m.Answer, &dns.AAAA{Hdr: hdr, AAAA: net.ParseIP("2001:db8::1")})
	}
	if opt := req.IsEdns0(); opt != nil {
		m.SetEdns0(opt.UDPSize(), false)
	}
	return m
}

func (s *Server) serveUDP() {
	defer s.wg.Done()
	buf := make([]byte, dns.MaxMsgSize)
	for {
		n, from, err := s.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		s.udpCount.Add(1)
		out, delay := s.respond(buf[:n], "udp")
		send := func() {
			for _, b := range out {
				s.udp.WriteToUDPAddrPort(b, from)
			}
		}
		if delay > 0 {
			time.AfterFunc(delay, send)
		} else {
			send()
		}
	}
}

func (s *Server) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.tcp.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed.Load() {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serveConn(c)
	}
}

// serveConn answers the queries of one connection as each is ready, not in
// order (RFC 7766 pipelining), so a slow answer holds up no other.
func (s *Server) serveConn(c net.Conn) {
	defer s.wg.Done()
	var writes sync.Mutex
	var answers sync.WaitGroup
	defer func() {
		answers.Wait()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	for {
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return
		}
		pkt := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, pkt); err != nil {
			return
		}
		s.tcpCount.Add(1)
		out, delay := s.respond(pkt, "tcp")
		answers.Go(func() {
			if delay > 0 {
				time.Sleep(delay)
			}
			writes.Lock()
			defer writes.Unlock()
			for _, b := range out {
				framed := binary.BigEndian.AppendUint16(nil, uint16(len(b)))
				if _, err := c.Write(append(framed, b...)); err != nil {
					return
				}
			}
		})
	}
}

// firstLabel is the lower-cased first label of req's question name.
func firstLabel(req *dns.Msg) string {
	if len(req.Question) == 0 {
		return ""
	}
	first, _, _ := strings.Cut(strings.ToLower(req.Question[0].Name), ".")
	return first
}
