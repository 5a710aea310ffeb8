package upstream

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
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

// Source ports come from the whole range above 1023, not from a few
// sockets the kernel placed in its ephemeral range.
func TestSourcePortsSpreadOverTheRange(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg { return []*dns.Msg{answer(req)} })
	var ports []int
	for range 16 {
		u, err := New(Config{Addr: srv.addr()})
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, portsInUse(u)...)
		u.Close()
	}
	var quarters [4]int
	for _, p := range ports {
		if p < 1024 {
			t.Fatalf("source port %d is below 1024", p)
		}
		quarters[(p-1024)*4/(65536-1024)]++
	}
	// 128 ports drawn uniformly: 32 expected per quarter; fewer than 12 is
	// four standard deviations away.
	for i, n := range quarters {
		if n < 12 {
			t.Errorf("%d ports: %v per quarter of 1024-65535; quarter %d has %d, want them spread over the range", len(ports), quarters, i, n)
			break
		}
	}
}

// A reply whose question differs from what was sent only in letter case
// does not answer the query while 0x20 is on; the caller gets the reply that
// does, with its own case restored in both the query and the reply.
func TestCaseChangedReplyIsNotAnAnswer(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, tcp bool) []*dns.Msg {
		if tcp {
			return []*dns.Msg{answer(req)}
		}
		changed := answer(req)
		changed.Question[0].Name = flipCase(req.Question[0].Name)
		rr, _ := dns.NewRR(req.Question[0].Name + " 60 IN A 203.0.113.66")
		changed.Answer = []dns.RR{rr}
		return []*dns.Msg{changed, answer(req)}
	})
	for _, name := range []string{"www.example.com.", "WwW.ExAmPlE.CoM.", "MAIL.EXAMPLE.ORG."} {
		t.Run(name, func(t *testing.T) {
			// An upstream of its own: this server changes the case of every
			// send, probes included, so that 0x20 ends up switched off.
			u := newUpstream(t, Config{Addr: srv.addr()})
			query := q(name)
			b, _ := query.Pack()
			sent := slices.Clone(b)
			type outcome struct {
				query, reply []byte
				err          error
			}
			ch := make(chan outcome, 1)
			u.Forward(b, "udp", func(query, reply []byte, err error) {
				ch <- outcome{slices.Clone(query), slices.Clone(reply), err}
			})
			var o outcome
			select {
			case o = <-ch:
			case <-time.After(5 * time.Second):
				t.Fatal("no report")
			}
			if o.err != nil {
				t.Fatal(o.err)
			}
			if string(o.query) != string(sent) {
				t.Errorf("done got the query %x, want it as the caller sent it: %x", o.query, sent)
			}
			m := new(dns.Msg)
			if err := m.Unpack(o.reply); err != nil {
				t.Fatal(err)
			}
			if got := m.Answer[0].(*dns.A).A; !got.Equal(net.IPv4(192, 0, 2, 1)) {
				t.Errorf("accepted the reply with the case changed (answer %v)", got)
			}
			if m.Question[0].Name != name {
				t.Errorf("reply's question %q, want the caller's %q", m.Question[0].Name, name)
			}
			if owner := m.Answer[0].Header().Name; owner != name {
				t.Errorf("answer's owner %q, want the caller's %q", owner, name)
			}
		})
	}
}

// flipCase swaps the case of every ASCII letter.
func flipCase(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case 'a' <= r && r <= 'z':
			return r - 'a' + 'A'
		case 'A' <= r && r <= 'Z':
			return r - 'A' + 'a'
		}
		return r
	}, s)
}

// A UDP reply with TC is the answer: the proxy advertises no more than it
// can give its client, so it relays TC and the client comes back over TCP.
func TestExchangeTruncatedReturnsTC(t *testing.T) {
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
	if !r.Truncated || len(r.Answer) != 0 || r.Question[0].Name != "a.example." {
		t.Fatalf("TC=%v with %d answers for %v, want the TC reply as it came", r.Truncated, len(r.Answer), r.Question)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.accepted != 0 {
		t.Fatalf("%d TCP connections, want none", srv.accepted)
	}
}

// A datagram larger than the read buffer cannot be read whole: that answer
// is fetched over TCP.
func TestOversizedUDPReplyGoesToTCP(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, tcp bool) []*dns.Msg {
		m := answer(req)
		for i := range 40 {
			rr, _ := dns.NewRR(fmt.Sprintf("%s 60 IN TXT \"%02d %s\"", req.Question[0].Name, i, strings.Repeat("x", 240)))
			m.Answer = append(m.Answer, rr)
		}
		return []*dns.Msg{m}
	})
	u := newUpstream(t, Config{Addr: srv.addr()})
	r, err := u.Exchange(context.Background(), q("big.example."), "udp")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Answer) != 41 {
		t.Fatalf("%d answers, want all 41", len(r.Answer))
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.accepted != 1 {
		t.Fatalf("%d TCP connections, want 1 for the reply larger than the buffer", srv.accepted)
	}
}

var errNoReport = errors.New("no report")

// Forged replies with the right ID and the case changed, one on each of
// many queries, switch nothing off: the real upstream echoes the case, and
// the queries that follow still go out with their letters mixed.
func TestForgedCaseChangesKeep0x20(t *testing.T) {
	var mu sync.Mutex
	forgedFor := map[string]bool{}
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg {
		name := strings.ToLower(req.Question[0].Name)
		mu.Lock()
		defer mu.Unlock()
		if !strings.HasPrefix(name, "forge") || forgedFor[name] {
			return []*dns.Msg{answer(req)}
		}
		forgedFor[name] = true // one forgery per query: a spoofer who guessed the ID once
		forged := answer(req)
		forged.Question[0].Name = flipCase(req.Question[0].Name)
		rr, _ := dns.NewRR(req.Question[0].Name + " 60 IN A 203.0.113.66")
		forged.Answer = []dns.RR{rr}
		return []*dns.Msg{forged, answer(req)}
	})
	u := newUpstream(t, Config{Addr: srv.addr()})
	for i := range 20 {
		r, err := u.Exchange(context.Background(), q(fmt.Sprintf("forged%d.example.", i)), "udp")
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Answer[0].(*dns.A).A; !got.Equal(net.IPv4(192, 0, 2, 1)) {
			t.Fatalf("query %d took the forged answer %v", i, got)
		}
	}
	const name = "after-the-forgeries.example." // 23 letters
	srv.mu.Lock()
	before := len(srv.names)
	srv.mu.Unlock()
	for range 10 {
		if _, err := u.Exchange(context.Background(), q(name), "udp"); err != nil {
			t.Fatal(err)
		}
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for _, sent := range srv.names[before:] {
		if sent == name {
			t.Fatalf("after 20 forged case changes, %q went out in the caller's case: 0x20 was switched off", sent)
		}
	}
	if st := u.Stats(); st.PlainCase || st.CaseMismatches < 20 {
		t.Fatalf("%+v, want 20 mismatches or more and 0x20 still on", st)
	}
}

// portsInUse returns the source ports of every UDP socket open at the
// moment, retired ones included: what an attacker who found them all knows.
func portsInUse(u *Upstream) []int {
	var ports []int
	for _, sl := range u.socks {
		for _, s := range sl.sockets() {
			ports = append(ports, s.port())
		}
	}
	return ports
}

// Sockets rotate: after SocketQueries queries or SocketLifetime, a fresh
// socket on a fresh random port takes the old one's place.
func TestSourcePortsRotate(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg { return []*dns.Msg{answer(req)} })
	for _, tt := range []struct {
		name    string
		cfg     Config
		queries int
		ports   int // distinct ports at least
		perPort int // queries on one port at most
	}{
		// 100 sockets of 3 queries each; a port drawn twice (7% likely) carries 6.
		{"after 3 queries", Config{UDPSockets: 2, SocketQueries: 3}, 300, 95, 6},
		// Every socket is past its lifetime when its first query goes out: one query each.
		{"after 1ns", Config{UDPSockets: 1, SocketLifetime: time.Nanosecond}, 40, 36, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv.mu.Lock()
			clear(srv.ports)
			srv.mu.Unlock()
			cfg := tt.cfg
			cfg.Addr = srv.addr()
			u := newUpstream(t, cfg)
			for range tt.queries {
				if _, err := u.Exchange(context.Background(), q("a.example."), "udp"); err != nil {
					t.Fatal(err)
				}
			}
			srv.mu.Lock()
			defer srv.mu.Unlock()
			if len(srv.ports) < tt.ports {
				t.Errorf("%d queries came from %d ports, want %d at least", tt.queries, len(srv.ports), tt.ports)
			}
			for port, n := range srv.ports {
				if n > tt.perPort {
					t.Errorf("port %d carried %d queries, want %d at most", port, n, tt.perPort)
				}
			}
			if st := u.Stats(); st.Rotations < uint64(tt.ports) || st.RotationErrors != 0 {
				t.Errorf("%+v, want %d rotations at least and no error", st, tt.ports)
			}
		})
	}
}

// A retired socket takes no new query but keeps reading: every query it
// carries gets its answer, exactly once; then it closes.
func TestRetiredSocketAnswersItsQueries(t *testing.T) {
	const queries = 100
	srv := newHeldServer(t, queries)
	u := newUpstream(t, Config{Addr: srv.addr().String(), Timeout: 10 * time.Second, UDPSockets: 1, SocketQueries: 10})
	reports := make([]atomic.Int32, queries)
	var wg sync.WaitGroup
	wg.Add(queries)
	for i := range queries {
		m := q(fmt.Sprintf("n%d.example.", i))
		b, _ := m.Pack()
		u.Forward(b, "udp", func(_, reply []byte, err error) {
			if err != nil {
				t.Errorf("query %d: %v", i, err)
			}
			if reports[i].Add(1) == 1 {
				wg.Done()
			}
		})
	}
	srv.waitSeen(t, 5*time.Second)
	if got := len(portsInUse(u)); got != queries/10+1 {
		t.Fatalf("%d sockets open with the %d queries waiting, want %d: 10 retired ones holding 10 each and the new one", got, queries, queries/10+1)
	}
	srv.release()
	waitGroup(t, &wg, 5*time.Second, "every query answered")
	deadline := time.Now().Add(5 * time.Second)
	for len(portsInUse(u)) > 1 { // the sweeper closes the drained ones at its next tick
		if time.Now().After(deadline) {
			t.Fatalf("%d sockets still open 5s after their last answer, want the current one only", len(portsInUse(u)))
		}
		time.Sleep(10 * time.Millisecond)
	}
	u.Close() // every report has happened once Close returns
	for i := range reports {
		if n := reports[i].Load(); n != 1 {
			t.Errorf("query %d reported %d times", i, n)
		}
	}
}

// An upstream that answers with the name in a case of its own costs the
// first query a few round trips (its probes), not the query: 0x20 is
// switched off for it, once, and the query sent again in the caller's case.
func TestCaseFallback(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg {
		m := answer(req)
		m.Question[0].Name = strings.ToLower(req.Question[0].Name)
		return []*dns.Msg{m}
	})
	fellBack := make(chan struct{}, 2)
	u := newUpstream(t, Config{Addr: srv.addr(), OnCaseFallback: func() { fellBack <- struct{}{} }})
	const name = "Mixed.Example.COM."
	r, err := u.Exchange(context.Background(), q(name), "udp")
	if err != nil {
		t.Fatal(err)
	}
	if r.Question[0].Name != name || !r.Answer[0].(*dns.A).A.Equal(net.IPv4(192, 0, 2, 1)) {
		t.Fatalf("got %v %v, want the answer with the caller's case", r.Question, r.Answer)
	}
	select {
	case <-fellBack:
	case <-time.After(5 * time.Second):
		t.Fatal("OnCaseFallback not called")
	}
	st := u.Stats()
	if !st.PlainCase || st.CaseProbes != caseProbes || st.CaseResends != 1 {
		t.Fatalf("%+v, want PlainCase after %d probes and 1 query sent again", st, caseProbes)
	}
	srv.mu.Lock()
	first := slices.Clone(srv.names)
	srv.mu.Unlock()
	if len(first) != caseProbes+2 || first[len(first)-1] != name {
		t.Fatalf("the upstream saw %q, want the query, %d probes, then the query in the caller's case", first, caseProbes)
	}
	for range 10 {
		if _, err := u.Exchange(context.Background(), q(name), "udp"); err != nil {
			t.Fatal(err)
		}
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for _, sent := range srv.names[len(first):] {
		if sent != name {
			t.Fatalf("after the fallback %q went out, want the caller's %q", sent, name)
		}
	}
	if len(srv.names) != len(first)+10 {
		t.Fatalf("10 queries after the fallback took %d sends", len(srv.names)-len(first))
	}
	if len(fellBack) != 0 || u.Stats().CaseProbes != caseProbes {
		t.Fatalf("the fallback was reported again or probes went on: %+v", u.Stats())
	}
}

// The evidence rule: only caseProbes probes in a row answered in another
// case switch 0x20 off. Here every send of a name is first answered by a
// forged reply with the case changed (a spoofer who knows each ID), the
// first `forged` sends of it; then by the real upstream, which echoes case.
func TestCaseFallbackNeedsProbesInARow(t *testing.T) {
	for forged := 1; forged <= caseProbes+1; forged++ {
		wantPlain := forged > caseProbes // the query and caseProbes probes
		t.Run(fmt.Sprintf("%d forged", forged), func(t *testing.T) {
			var mu sync.Mutex
			sends := map[string]int{}
			srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg {
				mu.Lock()
				defer mu.Unlock()
				name := strings.ToLower(req.Question[0].Name)
				sends[name]++
				if sends[name] > forged {
					return []*dns.Msg{answer(req)}
				}
				spoofed := answer(req)
				spoofed.Question[0].Name = flipCase(req.Question[0].Name)
				return []*dns.Msg{spoofed, answer(req)}
			})
			u := newUpstream(t, Config{Addr: srv.addr()})
			r, err := u.Exchange(context.Background(), q("victim.example."), "udp")
			if err != nil {
				t.Fatal(err)
			}
			if r.Question[0].Name != "victim.example." {
				t.Fatalf("reply for %v", r.Question)
			}
			// The probes run on after the query's answer: wait for the last.
			deadline := time.Now().Add(5 * time.Second)
			for u.cases.probing.Load() && !u.cases.plain.Load() {
				if time.Now().After(deadline) {
					t.Fatal("probes still running after 5s")
				}
				time.Sleep(time.Millisecond)
			}
			if st := u.Stats(); st.PlainCase != wantPlain {
				t.Fatalf("%d forged replies in a row: %+v, want PlainCase %v", forged, st, wantPlain)
			}
		})
	}
}

func TestEqualFoldOnlyOnNameLetters(t *testing.T) {
	question := func(name string, qtype, qclass uint16) []byte {
		m := new(dns.Msg)
		m.Question = []dns.Question{{Name: name, Qtype: qtype, Qclass: qclass}}
		b, _ := m.Pack()
		return b[12:]
	}
	for _, tt := range []struct {
		name string
		a, b []byte
		want bool
	}{
		{"same", question("a.example.", dns.TypeA, dns.ClassINET), question("a.example.", dns.TypeA, dns.ClassINET), true},
		{"name case", question("a.example.", dns.TypeA, dns.ClassINET), question("A.ExAmple.", dns.TypeA, dns.ClassINET), true},
		{"type differs by 0x20", question("a.example.", 0x41, dns.ClassINET), question("a.example.", 0x61, dns.ClassINET), false},
		{"class differs by 0x20", question("a.example.", dns.TypeA, 0x0043), question("a.example.", dns.TypeA, 0x0063), false},
		{"not letters differing by 0x20", question("a@.example.", dns.TypeA, dns.ClassINET), question("a`.example.", dns.TypeA, dns.ClassINET), false},
		{"other name", question("a.example.", dns.TypeA, dns.ClassINET), question("b.example.", dns.TypeA, dns.ClassINET), false},
		{"other length", question("a.example.", dns.TypeA, dns.ClassINET), question("aa.example.", dns.TypeA, dns.ClassINET), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := equalFold(tt.a, tt.b); got != tt.want {
				t.Errorf("equalFold(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
			}
		})
	}
}

// The round-robin counter wraps around without picking a socket out of
// range, on 32-bit platforms too (GOARCH=386 go test -run SocketIndex).
func TestSocketIndexWraps(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg { return []*dns.Msg{answer(req)} })
	u := newUpstream(t, Config{Addr: srv.addr(), UDPSockets: 3})
	u.next.Store(1<<31 - 2) // int(next) turns negative on 32 bits two queries from now
	for range 6 {
		if _, err := u.Exchange(context.Background(), q("a.example."), "udp"); err != nil {
			t.Fatal(err)
		}
	}
}
