package main

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dnsproxi/dnsserver"
	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
)

// servedLater serves each of qs and returns their recorders: answered when
// the forwarder releases them.
func servedLater(t *testing.T, srv *dnsserver.Server, qs []*dns.Msg) []*recorder {
	t.Helper()
	var ws []*recorder
	for _, q := range qs {
		b, err := q.Pack()
		if err != nil {
			t.Fatal(err)
		}
		w := &recorder{}
		srv.ServePacket(w, b)
		ws = append(ws, w)
	}
	return ws
}

// Identical queries in flight share one upstream query, and each client
// gets its own answer: its ID, its question as it wrote it, its own OPT,
// cut to its own size.
func TestCoalescing(t *testing.T) {
	names := []string{"www.example.com", "WWW.example.com", "www.EXAMPLE.com", "wWw.ExAmPlE.cOm", "www.example.COM"}
	tests := []struct {
		name     string
		qs       func() []*dns.Msg
		fail     bool
		upstream int
	}{
		{"same name, five cases", func() []*dns.Msg {
			var qs []*dns.Msg
			for _, n := range names {
				qs = append(qs, query(n, dns.TypeA))
			}
			return qs
		}, false, 1},
		{"same name, EDNS, sizes differ", func() []*dns.Msg {
			var qs []*dns.Msg
			for i, n := range names {
				qs = append(qs, ednsQuery(n, dns.TypeA, uint16(512+400*i), true))
			}
			return qs
		}, false, 1},
		{"the upstream fails: every client gets SERVFAIL", func() []*dns.Msg {
			var qs []*dns.Msg
			for _, n := range names {
				qs = append(qs, query(n, dns.TypeA))
			}
			return qs
		}, true, 1},
		{"ECS: coalesced, as the option is never forwarded", func() []*dns.Msg {
			var qs []*dns.Msg
			for _, n := range names[:2] {
				qs = append(qs, ednsQuery(n, dns.TypeA, 1232, false, &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(192, 0, 2, 0).To4()}))
			}
			return qs
		}, false, 1},
		{"DO, CD, EDNS, RD and type tell queries apart", func() []*dns.Msg {
			plain, do, edns, cd, norec, aaaa := query(names[0], dns.TypeA), ednsQuery(names[1], dns.TypeA, 1232, true),
				ednsQuery(names[2], dns.TypeA, 1232, false), query(names[3], dns.TypeA), query(names[4], dns.TypeA), query(names[0], dns.TypeAAAA)
			cd.CheckingDisabled, norec.RecursionDesired = true, false
			return []*dns.Msg{plain, do, edns, cd, norec, aaaa}
		}, false, 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fwd := &scripted{hold: true, reply: zone(func(req, m *dns.Msg) {
				if rr, ok := m.Answer[0].(*dns.A); ok { // about 700 bytes: too large for the 512-byte client
					for range 40 {
						m.Answer = append(m.Answer, &dns.A{Hdr: rr.Hdr, A: rr.A})
					}
				}
			})}
			if tt.fail {
				fwd.reply = nil
			}
			p, srv := unitProxy(nil, fwd)
			qs := tt.qs()
			for i, q := range qs {
				q.Id = uint16(1000 + i)
			}
			ws := servedLater(t, srv, qs)
			if got := len(fwd.sent()); got != tt.upstream {
				t.Fatalf("%d queries upstream for %d clients, want %d", got, len(qs), tt.upstream)
			}
			for i, w := range ws {
				if len(w.out)+w.dropped != 0 {
					t.Fatalf("client %d answered before the upstream", i)
				}
			}
			fwd.release()
			for i, w := range ws {
				if len(w.out) != 1 || w.dropped != 0 {
					t.Fatalf("client %d: %d answers, %d drops; want exactly one answer", i, len(w.out), w.dropped)
				}
				r := new(dns.Msg)
				if err := r.Unpack(w.out[0]); err != nil {
					t.Fatalf("client %d: %v", i, err)
				}
				q := qs[i]
				if r.Id != q.Id || r.Question[0].Name != q.Question[0].Name {
					t.Fatalf("client %d got ID %d question %q, want its own %d %q", i, r.Id, r.Question[0].Name, q.Id, q.Question[0].Name)
				}
				limit := 512
				if opt := q.IsEdns0(); opt != nil {
					limit = min(max(int(opt.UDPSize()), 512), 1232)
				}
				if len(w.out[0]) > limit {
					t.Fatalf("client %d: %d bytes for a client of %d", i, len(w.out[0]), limit)
				}
				if (q.IsEdns0() != nil) != (r.IsEdns0() != nil) {
					t.Fatalf("client %d: OPT %v for a query with OPT %v", i, r.IsEdns0(), q.IsEdns0())
				}
				if tt.fail && r.Rcode != dns.RcodeServerFailure {
					t.Fatalf("client %d: %s, want SERVFAIL", i, rcodeName(r))
				}
			}
			total := 0
			for _, qt := range []string{"A", "AAAA"} {
				total += outcomes(p, qt, "forwarded") + outcomes(p, qt, "upstream_error")
			}
			if total != len(qs) {
				t.Fatalf("%d queries counted, want each of %d once", total, len(qs))
			}
		})
	}
}

// UDP and TCP clients are not coalesced with each other: a UDP leader may
// get a TC answer a TCP client cannot use.
func TestCoalescingKeepsUDPAndTCPApart(t *testing.T) {
	up := startUpstream(t)
	held, release := holdGate(t)
	up.SetScript(func(req *dns.Msg, _ string) [][]byte {
		<-held
		b, _ := fakeupstream.Answer(req).Pack()
		return [][]byte{b}
	})
	cfg := testConfig(up.Addr())
	cfg.UpstreamTimeout = 10 * time.Second // held longer than the default on a loaded machine, the query would be sent again
	a := startProxy(t, cfg, guard.RealClock{})
	answers := make(chan *dns.Msg, 4)
	ask := func(network string) {
		go func() {
			r, _ := tryAsk(network, a.addr(), query("www.example.com", dns.TypeA), 5*time.Second)
			answers <- r
		}()
	}
	// The leaders first, at the upstream, then the followers: what is
	// counted is then which flight each joined.
	ask("udp")
	ask("tcp")
	waitFor(t, "the upstream to see one query per network", func() bool { udp, tcp := up.Received(); return udp == 1 && tcp == 1 })
	ask("udp")
	ask("tcp")
	waitFor(t, "four queries taken", func() bool { return a.server.Unanswered() == 4 })
	// A query the server has taken may not have reached its flight yet:
	// released before it joins, it would find the flight gone and ask again.
	waitFor(t, "a follower to join each network's flight", func() bool { return testutil.ToFloat64(a.metrics.Coalesced) == 2 })
	release()
	for range 4 {
		if r := <-answers; r == nil || r.Rcode != dns.RcodeSuccess {
			t.Fatalf("answer %v", r)
		}
	}
	if udp, tcp := up.Received(); udp != 1 || tcp != 1 {
		t.Fatalf("upstream saw %d UDP and %d TCP, want 1 and 1", udp, tcp)
	}
}

// Over TCP a query beyond the rate is refused, REFUSED: dropped, its client
// would wait out its whole timeout on a connection it holds open.
func TestTCPRateLimitIsRefused(t *testing.T) {
	up := startUpstream(t)
	cfg := testConfig(up.Addr())
	cfg.RateLimit = RateLimit{Rate: 1, Burst: 1}
	a := startProxy(t, cfg, guard.NewManualClock(time.Now()))
	ask(t, "tcp", a.addr(), query("www.example.com", dns.TypeA))
	r, err := tryAsk("tcp", a.addr(), ednsQuery("www.example.com", dns.TypeA, 1232, false), 2*time.Second)
	if err != nil || r.Rcode != dns.RcodeRefused || r.IsEdns0() == nil {
		t.Fatalf("beyond the rate over TCP: %v %v, want REFUSED with an OPT", r, err)
	}
	if got := count(a, "A", "rate_limited", 1); got != 1 {
		t.Fatalf("rate_limited %d, want 1", got)
	}
}

// An oversized UDP query pays the entry gate like any other: with a bucket
// of 2, 10 of them get at most 2 answers, and each is counted once.
func TestOversizedQueriesPayTheEntryGate(t *testing.T) {
	up := startUpstream(t)
	cfg := testConfig(up.Addr())
	cfg.RateLimit = RateLimit{Rate: 1, Burst: 2}
	a := startProxy(t, cfg, guard.NewManualClock(time.Now()))
	c, err := net.Dial("udp", a.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q := ednsQuery("www.example.com", dns.TypeA, 4096, false, &dns.EDNS0_LOCAL{Code: 65001, Data: make([]byte, 5000)})
	b, _ := q.Pack()
	for i := range 10 {
		binary.BigEndian.PutUint16(b, uint16(i))
		c.Write(b)
	}
	waitFor(t, "10 oversized queries counted", func() bool {
		return outcomes(a.proxy, "OTHER", "formerr")+outcomes(a.proxy, "OTHER", "rate_limited") == 10
	})
	if got := outcomes(a.proxy, "OTHER", "formerr"); got > 2 {
		t.Fatalf("%d oversized queries answered FORMERR with a bucket of 2", got)
	}
	if up.Total() != 0 {
		t.Fatal("an oversized query reached the upstream")
	}
}

// A flight takes at most maxFollowers followers; beyond them a query starts
// a new flight beside the full one, which the next identical queries join,
// and every client is still answered once.
func TestCoalescingBound(t *testing.T) {
	fwd := &scripted{hold: true, reply: zone(nil)}
	p, srv := unitProxy(nil, fwd)
	var qs []*dns.Msg
	for i := range 1 + maxFollowers + 3 {
		q := query("www.example.com", dns.TypeA)
		q.Id = uint16(i)
		qs = append(qs, q)
	}
	ws := servedLater(t, srv, qs)
	if got := len(fwd.sent()); got != 2 {
		t.Fatalf("%d queries upstream, want 2: one flight full, then one beside it for the other three", got)
	}
	fwd.release()
	for i, w := range ws {
		if len(w.out) != 1 || binary.BigEndian.Uint16(w.out[0]) != uint16(i) {
			t.Fatalf("client %d: %d answers", i, len(w.out))
		}
	}
	if got := outcomes(p, "A", "forwarded"); got != len(qs) {
		t.Fatalf("forwarded %d, want %d", got, len(qs))
	}
}

// The proxy's bound on followers in all (followerCap): a query a flight
// could take, once that many wait, is answered at once as the in-flight
// cap answers (REFUSED, outcome overloaded) and sends nothing; once the
// flights land their places are free again, for the next crowd. Names of
// several flights share the one bound.
func TestCoalescingFollowerCap(t *testing.T) {
	const followerCap = 5
	fwd := &scripted{hold: true, reply: zone(nil)}
	p, srv := unitProxy(nil, fwd)
	p.followerCap = followerCap
	for round := range 2 {
		var qs []*dns.Msg
		for i := range 12 { // two names, six askers each: 2 leaders, 5 followers, 5 refused
			q := query([]string{"a.example.com", "b.example.com"}[i%2], dns.TypeA)
			q.Id = uint16(i)
			qs = append(qs, q)
		}
		ws := servedLater(t, srv, qs)
		if got := len(fwd.sent()); got != 2*(round+1) {
			t.Fatalf("round %d: %d queries upstream in all, want %d: one a name", round, got, 2*(round+1))
		}
		refused := 0
		for _, w := range ws {
			if len(w.out) == 1 {
				if r := new(dns.Msg); r.Unpack(w.out[0]) != nil || r.Rcode != dns.RcodeRefused {
					t.Fatalf("round %d: an answer before the upstream's that is not REFUSED", round)
				}
				refused++
			}
		}
		if refused != len(qs)-2-followerCap || p.followers.Load() != followerCap {
			t.Fatalf("round %d: %d refused with %d followers waiting, want %d and %d", round, refused, p.followers.Load(), len(qs)-2-followerCap, followerCap)
		}
		fwd.release()
		for i, w := range ws {
			if len(w.out) != 1 {
				t.Fatalf("round %d: client %d: %d answers, want 1", round, i, len(w.out))
			}
		}
		if n := p.followers.Load(); n != 0 {
			t.Fatalf("round %d: %d followers counted after every flight landed", round, n)
		}
	}
	if got, want := outcomes(p, "A", "overloaded"), 2*(12-2-followerCap); got != want {
		t.Fatalf("overloaded %d, want %d", got, want)
	}
}

// The bound the proxy derives leaves room in the server's bound on
// unanswered queries for the queries answered at once, whatever the cap.
func TestFollowerBoundLeavesRoom(t *testing.T) {
	for _, maxInflight := range []int{0, 1, 10, 1000, 100000} {
		calls := maxInflight
		if maxInflight == 0 {
			calls = 0 // no cap: the calls are bounded by the server alone
		}
		b := followerBound(maxInflight)
		if b <= 0 || int64(calls)+b+followerRoom > int64(maxUnanswered(maxInflight)) {
			t.Errorf("cap %d: %d followers and %d calls leave less than %d of the server's %d", maxInflight, b, calls, followerRoom, maxUnanswered(maxInflight))
		}
	}
}
