package upstream

import (
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// heldServer is an upstream on loopback that reads every query and answers
// none until release is called; from then on it answers each query at once,
// the held ones first. It echoes the question as it came, letter case
// included, as a resolver that supports 0x20 does.
type heldServer struct {
	conn *net.UDPConn

	mu       sync.Mutex
	held     []heldQuery
	released bool
	seen     int
	reached  chan struct{} // closed when seen reaches want
	want     int
}

type heldQuery struct {
	req  *dns.Msg
	from *net.UDPAddr
}

func newHeldServer(t *testing.T, want int) *heldServer {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	conn.SetReadBuffer(4 << 20)
	s := &heldServer{conn: conn, reached: make(chan struct{}), want: want}
	var wg sync.WaitGroup
	wg.Go(s.serve)
	t.Cleanup(func() { conn.Close(); wg.Wait() })
	return s
}

func (s *heldServer) addr() *net.UDPAddr { return s.conn.LocalAddr().(*net.UDPAddr) }

func (s *heldServer) serve() {
	buf := make([]byte, 65535)
	for {
		n, from, err := s.conn.ReadFromUDP(buf)
		if err != nil {
			return
		}
		req := new(dns.Msg)
		if req.Unpack(buf[:n]) != nil || req.Response {
			continue
		}
		s.mu.Lock()
		s.seen++
		if s.seen == s.want {
			close(s.reached)
		}
		released := s.released
		if !released {
			s.held = append(s.held, heldQuery{req, from})
		}
		s.mu.Unlock()
		if released {
			s.answer(req, from)
		}
	}
}

func (s *heldServer) answer(req *dns.Msg, to *net.UDPAddr) {
	b, _ := answer(req).Pack()
	s.conn.WriteToUDP(b, to)
}

// release answers every held query and, from now on, every new one.
func (s *heldServer) release() {
	s.mu.Lock()
	held := s.held
	s.held, s.released = nil, true
	s.mu.Unlock()
	for _, h := range held {
		s.answer(h.req, h.from)
	}
}

// waitSeen waits until the server has read want queries.
func (s *heldServer) waitSeen(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-s.reached:
	case <-time.After(d):
		s.mu.Lock()
		defer s.mu.Unlock()
		t.Fatalf("the upstream saw %d queries in %v, want %d", s.seen, d, s.want)
	}
}

// The review's experiment, at the upstream level: many identical queries in
// flight, and an off-path attacker who knows the upstream's address and even
// the source ports in use (the worst case) races the real upstream with
// forged replies: the right question in the case a client would ask it, a
// wrong answer, random IDs. Not one forged answer may reach a caller.
func TestPoisoningExperiment(t *testing.T) {
	const (
		inFlight = 1000
		forged   = 10000
		name     = "poisoning-target.bank.example." // 26 letters: 26 bits of 0x20
	)
	srv := newHeldServer(t, inFlight)
	u := newUpstream(t, Config{Addr: srv.addr().String(), Timeout: 20 * time.Second})

	query := q(name)
	var answered, poisoned, failed atomic.Int32
	var wg sync.WaitGroup
	wg.Add(inFlight)
	for i := range inFlight {
		query.Id = uint16(i)
		b, _ := query.Pack()
		u.Forward(b, "udp", func(_, reply []byte, err error) {
			defer wg.Done()
			if err != nil {
				failed.Add(1)
				return
			}
			m := new(dns.Msg)
			if m.Unpack(reply) != nil || len(m.Answer) != 1 {
				failed.Add(1)
				return
			}
			if m.Answer[0].(*dns.A).A.Equal(net.IPv4(192, 0, 2, 1)) {
				answered.Add(1)
			} else {
				poisoned.Add(1)
			}
		})
	}
	srv.waitSeen(t, 10*time.Second)

	ports := portsInUse(u)
	fake := new(dns.Msg)
	fake.SetQuestion(name, dns.TypeA)
	fake.Response, fake.RecursionAvailable = true, true
	rr, _ := dns.NewRR(name + " 60 IN A 203.0.113.66")
	fake.Answer = []dns.RR{rr}
	pkt, _ := fake.Pack()
	to := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}
	for i := range forged {
		pkt[0], pkt[1] = byte(rand.Uint32()), byte(rand.Uint32())
		to.Port = ports[i%len(ports)]
		srv.conn.WriteToUDP(pkt, to) // from the upstream's own address, as a spoofer forges it
		if i%64 == 63 {
			time.Sleep(50 * time.Microsecond) // pace the flood so that the sockets' buffers hold it: more forgeries read, a harder test
		}
	}
	srv.release()

	waitGroup(t, &wg, 20*time.Second, "every query reported")
	t.Logf("%d forged replies to %d ports: %d queries answered, %d poisoned, %d failed; %d forgeries had a waiting ID and the case wrong",
		forged, len(ports), answered.Load(), poisoned.Load(), failed.Load(), u.Stats().CaseMismatches)
	if poisoned.Load() != 0 {
		t.Errorf("%d of %d queries took a forged answer", poisoned.Load(), inFlight)
	}
	if answered.Load() != inFlight {
		t.Errorf("%d of %d queries got the real answer", answered.Load(), inFlight)
	}
	if st := u.Stats(); st.PlainCase {
		t.Errorf("the flood switched 0x20 off: %+v", st)
	}
}

// waitGroup waits for wg, failing the test after d.
func waitGroup(t *testing.T, wg *sync.WaitGroup, d time.Duration, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("not %s within %v", what, d)
	}
}
