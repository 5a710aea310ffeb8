package dnsserver

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// echo answers every query with NOERROR and its question, FORMERR if it is
// malformed.
var echo = HandlerFunc(func(w ResponseWriter, q *Query) {
	if q.Malformed {
		w.Write(wire.AppendReply(nil, q.Wire, wire.HeaderLen, dns.RcodeFormatError))
		return
	}
	w.Write(wire.AppendReply(nil, q.Wire, q.QEnd, dns.RcodeSuccess))
})

// holder keeps every query unanswered until release, the way a handler
// waiting for an upstream does.
type holder struct {
	mu      sync.Mutex
	held    []func()
	auto    bool // answer at once from now on
	entered chan struct{}
}

func newHolder() *holder { return &holder{entered: make(chan struct{}, 100)} }

func (h *holder) ServeDNS(w ResponseWriter, q *Query) {
	reply := wire.AppendReply(nil, q.Wire, q.QEnd, dns.RcodeSuccess) // q.Wire is not ours to keep
	h.mu.Lock()
	if h.auto {
		h.mu.Unlock()
		w.Write(reply)
		return
	}
	h.held = append(h.held, func() { w.Write(reply) })
	h.mu.Unlock()
	h.entered <- struct{}{}
}

func (h *holder) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.held)
}

// release answers every query held so far, and with auto every later one at once.
func (h *holder) release(auto ...bool) {
	h.mu.Lock()
	held := h.held
	h.held = nil
	h.auto = len(auto) > 0 && auto[0]
	h.mu.Unlock()
	for _, answer := range held {
		answer()
	}
}

func startServer(t *testing.T, s *Server) string {
	t.Helper()
	return startAt(t, s, "127.0.0.1:0")
}

// startAt starts s on addr (echo, unless it has a handler), failing the
// test if it cannot, and shuts it down at the end of the test.
func startAt(t *testing.T, s *Server, addr string) string {
	t.Helper()
	s.Addr = addr
	if s.Handler == nil {
		s.Handler = echo
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	return s.LocalAddr().String()
}

func ask(network, addr string, timeout time.Duration) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion("www.example.com.", dns.TypeA)
	c := &dns.Client{Net: network, Timeout: timeout}
	r, _, err := c.Exchange(m, addr)
	return r, err
}

// closedByServer reports whether the server closes c before timeout.
func closedByServer(c net.Conn, timeout time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(timeout))
	_, err := c.Read(make([]byte, 1))
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err)
}

func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && !ne.Timeout()
}

func TestServesBothNetworksOnOnePort(t *testing.T) {
	addr := startServer(t, &Server{})
	for _, network := range []string{"udp", "tcp"} {
		if r, err := ask(network, addr, time.Second); err != nil || r.Rcode != dns.RcodeSuccess {
			t.Errorf("%s: %v %v", network, r, err)
		}
	}
}

func TestTCPStalledQueryIsClosed(t *testing.T) {
	addr := startServer(t, &Server{TCPIdleTimeout: 100 * time.Millisecond})
	for _, sent := range [][]byte{nil, {0}, {0, 40, 1, 2, 3}} { // nothing, half a length, half a body
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(sent)
		if !closedByServer(c, 3*time.Second) {
			t.Errorf("after sending %d bytes and stalling, the connection is still open", len(sent))
		}
		c.Close()
	}
}

// Half-sent queries that hold every TCP slot cost their senders only: each
// new connection is served in the place of the oldest of them, UDP clients
// are answered throughout, and each half-sent query not closed for a
// newcomer is still served once it is whole.
func TestSlowlorisDoesNotStarveTCPOrUDP(t *testing.T) {
	const slots, beyond = 100, 20
	var dropped reasons
	addr := startServer(t, &Server{MaxTCPConns: slots, TCPIdleTimeout: time.Minute, OnDropped: dropped.add})
	m := new(dns.Msg).SetQuestion("www.example.com.", dns.TypeA)
	query := frame(t, m)
	held := dialAll(t, addr, slots)
	for _, c := range held {
		c.Write(query[:1]) // half a length prefix, then nothing
	}
	for i := range beyond {
		c := dialAll(t, addr, 1)[0]
		if r, err := askOn(c, "new.example.", 5*time.Second); err != nil || r.Rcode != dns.RcodeSuccess {
			t.Fatalf("newcomer %d with every slot held half-way: %v %v", i, r, err)
		}
		if !closedByServer(held[i], 5*time.Second) {
			t.Fatalf("newcomer %d: held[%d], the oldest half-sent query left, is still open", i, i)
		}
		if r, err := ask("udp", addr, time.Second); err != nil || r.Rcode != dns.RcodeSuccess {
			t.Fatalf("UDP query %d under a slowloris: %v %v", i, r, err)
		}
	}
	if n := dropped.count("tcp_idle_evicted"); n != beyond {
		t.Errorf("OnDropped(tcp_idle_evicted) called %d times, want %d", n, beyond)
	}
	if n := dropped.count("tcp_conn_limit"); n != 0 {
		t.Errorf("OnDropped(tcp_conn_limit) called %d times, want 0", n)
	}
	for i, c := range held[beyond:] {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(query[1:]); err != nil {
			t.Fatalf("held connection %d: %v", beyond+i, err)
		}
		if r, err := (&dns.Conn{Conn: c}).ReadMsg(); err != nil || r.Id != m.Id {
			t.Fatalf("held connection %d, once its query is whole: %v %v", beyond+i, r, err)
		}
	}
}

// Beyond MaxUnanswered a TCP query is REFUSED at once and a UDP one dropped:
// an answer the handler's gates never saw is not sent to an unproven address.
func TestPendingCapAnswersRefused(t *testing.T) {
	h := newHolder()
	overloaded := make(chan string, 10)
	addr := startServer(t, &Server{MaxUnanswered: 1, Handler: h, OnDropped: func(r string) { overloaded <- r }})
	defer h.release()
	go ask("udp", addr, 5*time.Second)
	<-h.entered
	r, err := ask("tcp", addr, time.Second)
	if err != nil || r.Rcode != dns.RcodeRefused {
		t.Fatalf("tcp beyond MaxUnanswered: %v %v, want REFUSED at once", r, err)
	}
	if reason := <-overloaded; reason != "overloaded" {
		t.Fatalf("dropped as %q, want overloaded", reason)
	}
	go ask("udp", addr, 100*time.Millisecond)
	select {
	case reason := <-overloaded:
		if reason != "overloaded" {
			t.Fatalf("dropped as %q, want overloaded", reason)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a UDP query beyond MaxUnanswered was not dropped")
	}
	if h.count() != 1 {
		t.Fatalf("the handler holds %d queries, want only the first", h.count())
	}
}

func TestTCPPipelineBound(t *testing.T) {
	h := newHolder()
	addr := startServer(t, &Server{TCPPipeline: 2, Handler: h})
	c, err := dns.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 5 {
		m := new(dns.Msg)
		m.SetQuestion("www.example.com.", dns.TypeA)
		m.Id = uint16(i + 1)
		c.WriteMsg(m)
	}
	<-h.entered
	<-h.entered
	select {
	case <-h.entered:
		t.Fatal("a third query was taken while two on the connection were unanswered")
	case <-time.After(100 * time.Millisecond): // the negative: nothing more may arrive
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	h.release(true)
	for range 5 {
		if _, err := c.ReadMsg(); err != nil {
			t.Fatalf("reading the pipelined answers: %v", err)
		}
	}
}

func TestShutdownFinishesQueriesInFlight(t *testing.T) {
	h := newHolder()
	s := &Server{Addr: "127.0.0.1:0", Handler: h}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	addr := s.LocalAddr().String()
	answers := make(chan error, 2)
	for _, network := range []string{"udp", "tcp"} {
		go func() { _, err := ask(network, addr, 5*time.Second); answers <- err }()
	}
	<-h.entered
	<-h.entered
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(context.Background()) }()
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned (%v) with queries unanswered", err)
	case <-time.After(50 * time.Millisecond):
	}
	h.release()
	for range 2 {
		if err := <-answers; err != nil {
			t.Errorf("a query in flight at shutdown: %v", err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if s.Unanswered() != 0 {
		t.Errorf("%d queries pending after Shutdown", s.Unanswered())
	}
	if _, err := ask("udp", addr, 200*time.Millisecond); err == nil {
		t.Error("still answering UDP after Shutdown")
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Error("still accepting TCP after Shutdown")
	}
}

func TestParse(t *testing.T) {
	pack := func(m *dns.Msg) []byte { b, _ := m.Pack(); return b }
	plain := pack(new(dns.Msg).SetQuestion("a.example.", dns.TypeMX))
	edns := new(dns.Msg).SetQuestion("a.example.", dns.TypeA)
	edns.SetEdns0(1232, false)
	tiny := new(dns.Msg).SetQuestion("a.example.", dns.TypeA)
	tiny.SetEdns0(100, false)
	withTSIG := new(dns.Msg).SetQuestion("a.example.", dns.TypeA)
	withTSIG.SetEdns0(4096, false)
	withTSIG.Extra = append(withTSIG.Extra, &dns.TXT{Hdr: dns.RR_Header{Name: "x.", Rrtype: dns.TypeTXT, Class: dns.ClassINET}, Txt: []string{"x"}})
	tests := []struct {
		name    string
		pkt     []byte
		ok      bool
		qd      int
		qtype   uint16
		udpSize int
	}{
		{"plain", plain, true, 1, dns.TypeMX, 512},
		{"edns", pack(edns), true, 1, dns.TypeA, 1232},
		{"edns below 512", pack(tiny), true, 1, dns.TypeA, 512},
		{"extra records: the slow path", pack(withTSIG), true, 1, dns.TypeA, 4096},
		{"no question", pack(new(dns.Msg)), true, 0, 0, 512},
		{"short", plain[:5], false, 0, 0, 512},
		{"cut question: Malformed", plain[:len(plain)-1], true, 1, 0, 512},
		{"response", pack(new(dns.Msg).SetReply(new(dns.Msg).SetQuestion("a.", dns.TypeA))), false, 1, dns.TypeA, 512},
	}
	s := &Server{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var q Query
			ok := s.parse(&q, tt.pkt, "udp")
			if ok != tt.ok {
				t.Fatalf("ok = %v, want %v", ok, tt.ok)
			}
			if !ok {
				return
			}
			if q.QDCount != tt.qd || q.QType != tt.qtype || q.UDPSize != tt.udpSize {
				t.Fatalf("parsed %+v", q)
			}
			if tt.qd == 1 {
				if end, ok := wire.QuestionEnd(tt.pkt); ok && q.QEnd != end {
					t.Fatalf("QEnd %d, want %d", q.QEnd, end)
				}
			}
		})
	}
}

// recorder keeps what a handler or the server writes for one packet.
type recorder struct {
	answer
	out     []byte
	dropped bool
}

func (r *recorder) Write(b []byte) error { r.finish(); r.out = append([]byte(nil), b...); return nil }
func (r *recorder) Drop()                { r.finish(); r.dropped = true }

func TestServeAnswersWhatItCannotParse(t *testing.T) {
	s := &Server{Handler: echo}
	s.setDefaults()
	tests := []struct {
		name string
		pkt  []byte
		want []byte // nil: dropped
	}{
		{"short", []byte{1, 2, 3}, nil},
		{"a response", []byte{0, 7, 0x80, 0, 0, 1, 0, 0, 0, 0, 0, 0}, nil},
		{"query with RD and opcode", []byte{0xAB, 0xCD, 0x01 | 0x10, 0x20, 0, 1, 0, 0, 0, 0, 0, 0, 0xFF},
			[]byte{0xAB, 0xCD, 0x80 | 0x01 | 0x10, 0x80 | dns.RcodeFormatError, 0, 0, 0, 0, 0, 0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &recorder{}
			r.start(s)
			s.ServePacket(r, tt.pkt)
			if string(r.out) != string(tt.want) || (tt.want == nil) != r.dropped {
				t.Fatalf("wrote %x (dropped %v), want %x", r.out, r.dropped, tt.want)
			}
			if s.Unanswered() != 0 {
				t.Fatalf("%d pending: the packet was not finished", s.Unanswered())
			}
		})
	}
}

func TestOversizedUDPQueryGetsFormErr(t *testing.T) {
	addr := startServer(t, &Server{})
	q := new(dns.Msg).SetQuestion("www.example.com.", dns.TypeA)
	q.SetEdns0(4096, false)
	q.IsEdns0().Option = append(q.IsEdns0().Option, &dns.EDNS0_LOCAL{Code: 65001, Data: make([]byte, 5000)})
	q.Id = 99
	b, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write(b)
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	r := new(dns.Msg)
	if err := r.Unpack(buf[:n]); err != nil || r.Id != 99 || r.Rcode != dns.RcodeFormatError {
		t.Fatalf("a %d-byte query: %v %v, want FORMERR", len(b), r, err)
	}
	if r2, err := ask("udp", addr, time.Second); err != nil || r2.Rcode != dns.RcodeSuccess {
		t.Fatalf("after it: %v %v", r2, err)
	}
}
