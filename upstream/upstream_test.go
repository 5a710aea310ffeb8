package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
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
	names    []string    // question names as they arrived
	ports    map[int]int // queries from each source port
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
	s := &testServer{udp: udp, tcp: tcp, respond: respond, ports: map[int]int{}}
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
	if len(req.Question) == 1 {
		s.names = append(s.names, req.Question[0].Name)
	}
	s.ports[port]++
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
	distinct := map[uint16]int{}
	for _, id := range srv.ids {
		distinct[id]++
	}
	if len(distinct) < 90 {
		t.Errorf("100 queries went out under %d distinct IDs: not random", len(distinct))
	}
	if distinct[4242] > 1 { // once is chance (100 in 65,536); twice is one in a million
		t.Errorf("the client's ID went upstream %d times of 100", distinct[4242])
	}
	if len(srv.ports) != 4 { // 25 queries each, far below a socket's bound
		t.Errorf("100 queries came from %d source ports, want the 4 sockets", len(srv.ports))
	}
}

// Replies that do not match are skipped; the first that does is the
// answer. A name whose case changed on the way matches only where 0x20 is
// not in use: with 0x20 off, and over TCP.
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
		caseChanged := answer(req)
		caseChanged.Question[0].Name = flipCase(req.Question[0].Name)
		caseChanged.Answer[0].(*dns.A).A = net.IPv4(192, 0, 2, 2)
		return []*dns.Msg{wrongID, wrongName, wrongType, notReply, caseChanged, answer(req)}
	})
	for _, tt := range []struct {
		name    string
		network string
		no0x20  bool
		want    net.IP
	}{
		{"udp with 0x20: the exact reply", "udp", false, net.IPv4(192, 0, 2, 1)},
		{"udp without 0x20: the case-changed reply", "udp", true, net.IPv4(192, 0, 2, 2)},
		{"tcp: the case-changed reply", "tcp", false, net.IPv4(192, 0, 2, 2)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			u := newUpstream(t, Config{Addr: srv.addr(), Disable0x20: tt.no0x20})
			r, err := u.Exchange(context.Background(), q("a.example."), tt.network)
			if err != nil {
				t.Fatal(err)
			}
			if r.Question[0].Name != "a.example." || r.Question[0].Qtype != dns.TypeA {
				t.Fatalf("accepted %v, want a.example. A in the caller's case", r.Question[0])
			}
			if got := r.Answer[0].(*dns.A).A; !got.Equal(tt.want) {
				t.Fatalf("accepted the reply with %v, want the one with %v", got, tt.want)
			}
		})
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
// answered, answered twice, never answered (the sweeper), cut off by Close,
// on a socket that retired while it waited, or sent again in the caller's
// case once the upstream is found not to echo case. done gets the query as
// the caller sent it, ID and case.
func TestForwardReportsExactlyOnce(t *testing.T) {
	for _, tt := range []struct {
		name       string
		changeCase bool // the upstream answers with the name in lower case
	}{
		{"echoing upstream, rotating sockets", false},
		{"upstream that does not echo case, rotating sockets", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			n := 0
			seen := map[string]bool{}
			srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg {
				m := answer(req)
				if tt.changeCase {
					m.Question[0].Name = strings.ToLower(m.Question[0].Name)
				}
				mu.Lock()
				defer mu.Unlock()
				name := strings.ToLower(req.Question[0].Name)
				if seen[name] || name == "localhost." { // a probe or a query sent again: answered, so that the fallback happens
					return []*dns.Msg{m}
				}
				seen[name] = true
				n++
				switch n % 3 {
				case 0:
					return nil // never answered
				case 1:
					return []*dns.Msg{m, m} // answered twice
				}
				return []*dns.Msg{m}
			})
			fellBack := make(chan struct{})
			var once sync.Once
			// A probe waits a tenth of the timeout for its reply (no quickest
			// reply yet: the upstream never echoes case), and a probe with no
			// reply gives no verdict: 100 ms leaves room for a loaded machine.
			u, err := New(Config{Addr: srv.addr(), Timeout: time.Second, UDPSockets: 2, SocketQueries: 7,
				OnCaseFallback: func() { once.Do(func() { close(fellBack) }) }})
			if err != nil {
				t.Fatal(err)
			}
			const queries = 300
			const most = queries + 500 // with those sent while waiting for the fallback
			reports := make([]atomic.Int32, most)
			var reported, timedOut atomic.Int32
			someReported, someTimedOut := make(chan struct{}), make(chan struct{})
			var wrongQuery atomic.Pointer[string]
			sentQueries := 0
			send := func(i int) {
				sentQueries++
				m := q(dns.Fqdn(fmt.Sprintf("N%d.Example", i)))
				m.Id = uint16(i)
				b, _ := m.Pack()
				sent := string(b)
				network := "udp"
				if i%10 == 0 {
					network = "tcp"
				}
				u.Forward(b, network, func(query, _ []byte, err error) {
					if string(query) != sent {
						got := fmt.Sprintf("query %d came back as %x, want %x", i, query, sent)
						wrongQuery.Store(&got)
					}
					reports[i].Add(1)
					if reported.Add(1) == queries/3 {
						close(someReported)
					}
					if errors.Is(err, ErrTimeout) && timedOut.Add(1) == 1 {
						close(someTimedOut)
					}
				})
			}
			for i := range queries {
				send(i)
				if i == queries*2/3 { // let some finish, some expire, 0x20 fall back; leave others in flight for Close
					waitFor(t, someReported, "a third of the queries reported")
					waitFor(t, someTimedOut, "a query expired")
					// Until the fallback, a query goes out every 10 ms: when
					// it comes, some are waiting with a reply in another case,
					// to be sent again, however long the probes took (the
					// first queries' deadline may have passed by then).
				waitFallback:
					for extra := queries; tt.changeCase; extra++ {
						select {
						case <-fellBack:
							break waitFallback
						case <-time.After(10 * time.Millisecond):
							if extra == most {
								t.Fatalf("no fallback to plain case after %d queries more", most-queries)
							}
							send(extra)
						}
					}
				}
			}
			u.Close() // it has returned: every report has happened
			for i := range reports[:sentQueries] {
				if got := reports[i].Load(); got != 1 {
					t.Errorf("query %d reported %d times", i, got)
				}
			}
			if p := wrongQuery.Load(); p != nil {
				t.Error(*p)
			}
			st := u.Stats()
			if st.Rotations == 0 {
				t.Errorf("no socket rotated: %+v", st)
			}
			if st.PlainCase != tt.changeCase || (st.CaseResends > 0) != tt.changeCase {
				t.Errorf("PlainCase %v with %d queries sent again, want %v: %+v", st.PlainCase, st.CaseResends, tt.changeCase, st)
			}
		})
	}
}

// waitFor waits for ch to close, failing the test after 5 seconds.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("waited 5s for %s", what)
	}
}
