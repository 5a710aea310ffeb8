package upstream

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// testServer is a minimal upstream on loopback: respond decides what to
// send back for each query (nil: nothing), and it records what it saw.
type testServer struct {
	udp     *net.UDPConn
	tcp     *net.TCPListener
	respond func(req *dns.Msg, tcp bool) []*dns.Msg

	mu       sync.Mutex
	ids      []uint16
	ports    map[int]bool
	accepted int
}

func newTestServer(t *testing.T, respond func(req *dns.Msg, tcp bool) []*dns.Msg) *testServer {
	t.Helper()
	var udp *net.UDPConn
	var tcp *net.TCPListener
	for attempt := 0; tcp == nil; attempt++ { // the port UDP got may be taken for TCP: try another
		var err error
		if udp, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
			t.Fatal(err)
		}
		tcp, err = net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: udp.LocalAddr().(*net.UDPAddr).Port})
		if err != nil {
			udp.Close()
			if attempt == 10 {
				t.Fatal(err)
			}
		}
	}
	s := &testServer{udp: udp, tcp: tcp, respond: respond, ports: map[int]bool{}}
	var wg sync.WaitGroup
	wg.Go(s.serveUDP)
	wg.Go(s.serveTCP)
	t.Cleanup(func() { udp.Close(); tcp.Close(); wg.Wait() })
	return s
}

func (s *testServer) addr() string { return s.udp.LocalAddr().String() }

func (s *testServer) saw(req *dns.Msg, port int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids = append(s.ids, req.Id)
	s.ports[port] = true
}

func (s *testServer) serveUDP() {
	buf := make([]byte, 65535)
	for {
		n, from, err := s.udp.ReadFromUDP(buf)
		if err != nil {
			return
		}
		req := new(dns.Msg)
		if req.Unpack(buf[:n]) != nil {
			continue
		}
		s.saw(req, from.Port)
		for _, m := range s.respond(req, false) {
			b, _ := m.Pack()
			s.udp.WriteToUDP(b, from)
		}
	}
}

func (s *testServer) serveTCP() {
	for {
		c, err := s.tcp.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.accepted++
		s.mu.Unlock()
		go func() {
			defer c.Close()
			dc := &dns.Conn{Conn: c}
			for {
				req, err := dc.ReadMsg()
				if err != nil {
					return
				}
				s.saw(req, 0)
				for _, m := range s.respond(req, true) {
					if m == closeConn {
						return
					}
					dc.WriteMsg(m)
				}
			}
		}()
	}
}

// closeConn in a TCP response list closes the connection there.
var closeConn = new(dns.Msg)

func answer(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	rr, _ := dns.NewRR(req.Question[0].Name + " 60 IN A 192.0.2.1")
	m.Answer = []dns.RR{rr}
	return m
}

func newUpstream(t *testing.T, cfg Config) *Upstream {
	t.Helper()
	u, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	return u
}

func q(name string) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	m.Id = 4242
	return m
}

func TestExchangeRandomIDsRestoredOnReturn(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg { return []*dns.Msg{answer(req)} })
	u := newUpstream(t, Config{Addr: srv.addr(), UDPSockets: 4})
	for range 100 {
		r, err := u.Exchange(context.Background(), q("a.example."), "udp")
		if err != nil {
			t.Fatal(err)
		}
		if r.Id != 4242 {
			t.Fatalf("reply ID %d, want the query's 4242 restored", r.Id)
		}
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	distinct := map[uint16]bool{}
	for _, id := range srv.ids {
		distinct[id] = true
	}
	if len(distinct) < 90 {
		t.Errorf("100 queries went out under %d distinct IDs: not random", len(distinct))
	}
	if distinct[4242] && len(distinct) < 100 {
		t.Errorf("the client's ID went upstream")
	}
	if len(srv.ports) > 4 {
		t.Errorf("100 queries came from %d source ports, want at most the 4 shared sockets", len(srv.ports))
	}
}

func TestExchangeIgnoresRepliesThatDoNotMatch(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg {
		wrongID := answer(req)
		wrongID.Id++
		wrongName := answer(req)
		wrongName.Question[0].Name = "b.example."
		wrongType := answer(req)
		wrongType.Question[0].Qtype = dns.TypeAAAA
		notReply := answer(req)
		notReply.Response = false
		right := answer(req)
		right.Question[0].Name = "A.EXAMPLE." // case may change on the way: still the same name
		return []*dns.Msg{wrongID, wrongName, wrongType, notReply, right, answer(req)}
	})
	u := newUpstream(t, Config{Addr: srv.addr()})
	for _, network := range []string{"udp", "tcp"} {
		r, err := u.Exchange(context.Background(), q("a.example."), network)
		if err != nil {
			t.Fatalf("%s: %v", network, err)
		}
		if r.Question[0].Name != "A.EXAMPLE." || r.Question[0].Qtype != dns.TypeA {
			t.Fatalf("%s: accepted %v, want the first matching reply", network, r.Question[0])
		}
	}
}

func TestExchangeTimeoutAndCancel(t *testing.T) {
	srv := newTestServer(t, func(*dns.Msg, bool) []*dns.Msg { return nil })
	u := newUpstream(t, Config{Addr: srv.addr(), Timeout: 50 * time.Millisecond})
	for _, network := range []string{"udp", "tcp"} {
		if _, err := u.Exchange(context.Background(), q("a.example."), network); !errors.Is(err, ErrTimeout) {
			t.Errorf("%s: %v, want ErrTimeout", network, err)
		}
	}
	u2 := newUpstream(t, Config{Addr: srv.addr(), Timeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	start := time.Now()
	if _, err := u2.Exchange(ctx, q("a.example."), "udp"); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v, want context.Canceled", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("cancel took %v", time.Since(start))
	}
}

func TestExchangeTruncatedRetriesOverTCP(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, tcp bool) []*dns.Msg {
		m := answer(req)
		if !tcp {
			m.Answer, m.Truncated = nil, true
		}
		return []*dns.Msg{m}
	})
	u := newUpstream(t, Config{Addr: srv.addr()})
	r, err := u.Exchange(context.Background(), q("a.example."), "udp")
	if err != nil {
		t.Fatal(err)
	}
	if r.Truncated || len(r.Answer) != 1 {
		t.Fatalf("TC=%v with %d answers, want the full answer over TCP", r.Truncated, len(r.Answer))
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.accepted != 1 {
		t.Fatalf("%d TCP connections, want 1 for the retry", srv.accepted)
	}
}

func TestTCPConnectionsAreReused(t *testing.T) {
	var mu sync.Mutex
	n := 0
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg {
		mu.Lock()
		defer mu.Unlock()
		n++
		if n == 5 { // the upstream closes the idle connection after the 4th answer
			return []*dns.Msg{answer(req), closeConn}
		}
		return []*dns.Msg{answer(req)}
	})
	u := newUpstream(t, Config{Addr: srv.addr()})
	for i := range 10 {
		if _, err := u.Exchange(context.Background(), q("a.example."), "tcp"); err != nil {
			t.Fatalf("exchange %d: %v", i, err)
		}
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.accepted != 2 {
		t.Errorf("10 sequential TCP exchanges opened %d connections, want 2 (one reused, one after the upstream closed it)", srv.accepted)
	}
}

func TestExchangeRejectsBadQueriesAndClosed(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg { return []*dns.Msg{answer(req)} })
	u := newUpstream(t, Config{Addr: srv.addr()})
	if _, err := u.Exchange(context.Background(), new(dns.Msg), "udp"); !errors.Is(err, ErrNoQuery) {
		t.Errorf("no question: %v, want ErrNoQuery", err)
	}
	u.Close()
	if _, err := u.Exchange(context.Background(), q("a.example."), "udp"); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}

// A burst of queries on one socket: every reply reaches its own exchange.
func TestConcurrentExchangesOnSharedSockets(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg { return []*dns.Msg{answer(req)} })
	u := newUpstream(t, Config{Addr: srv.addr(), UDPSockets: 1})
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		wg.Go(func() {
			name := dns.Fqdn("n" + string(rune('a'+i%26)) + ".example")
			r, err := u.Exchange(context.Background(), q(name), "udp")
			if err == nil && r.Question[0].Name != name {
				err = errors.New("reply for another question: " + r.Question[0].Name)
			}
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// Every query Forward takes is reported exactly once, whichever way it ends:
// answered, answered twice, never answered (the sweeper), or cut off by Close.
func TestForwardReportsExactlyOnce(t *testing.T) {
	var mu sync.Mutex
	n := 0
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg {
		mu.Lock()
		defer mu.Unlock()
		n++
		switch n % 3 {
		case 0:
			return nil // never answered
		case 1:
			return []*dns.Msg{answer(req), answer(req)} // answered twice
		}
		return []*dns.Msg{answer(req)}
	})
	u, err := New(Config{Addr: srv.addr(), Timeout: 30 * time.Millisecond, UDPSockets: 2})
	if err != nil {
		t.Fatal(err)
	}
	const queries = 300
	reports := make([]atomic.Int32, queries)
	var all sync.WaitGroup
	all.Add(queries)
	for i := range queries {
		m := q(dns.Fqdn(fmt.Sprintf("n%d.example", i)))
		m.Id = uint16(i)
		b, _ := m.Pack()
		network := "udp"
		if i%10 == 0 {
			network = "tcp"
		}
		u.Forward(b, network, func(query, _ []byte, _ error) {
			id := binary.BigEndian.Uint16(query)
			if reports[id].Add(1) == 1 {
				all.Done()
			}
		})
		if i == queries*2/3 {
			time.Sleep(10 * time.Millisecond) // let some finish, leave others in flight for Close
		}
	}
	u.Close()
	waited := make(chan struct{})
	go func() { all.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("some queries were never reported")
	}
	time.Sleep(50 * time.Millisecond) // a second report, if there were one, would come now
	for i := range reports {
		if got := reports[i].Load(); got != 1 {
			t.Errorf("query %d reported %d times", i, got)
		}
	}
}
