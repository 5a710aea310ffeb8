package main

import (
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
)

func TestForwardUDPAndTCP(t *testing.T) {
	up := startUpstream(t)
	a := startProxy(t, testConfig(up.Addr()), guard.RealClock{})
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			q := query("www.example.com", dns.TypeA)
			q.Id = 4242
			r := ask(t, network, a.addr(), q)
			if r.Id != 4242 {
				t.Errorf("reply ID %d, want the client's 4242", r.Id)
			}
			if len(r.Answer) != 1 || !strings.Contains(r.Answer[0].String(), "192.0.2.1") {
				t.Errorf("answer %q, want 192.0.2.1", answerText(r))
			}
			if r.Question[0] != q.Question[0] {
				t.Errorf("question %v, want %v", r.Question[0], q.Question[0])
			}
		})
	}
	udp, tcp := up.Received()
	if udp != 1 || tcp != 1 {
		t.Errorf("upstream saw %d UDP and %d TCP queries, want 1 and 1: the client's network is kept", udp, tcp)
	}
	if got := count(a, "A", "forwarded", 2); got != 2 {
		t.Errorf("forwarded count %d, want 2", got)
	}
}

func TestForwardPassesRcodesThrough(t *testing.T) {
	up := startUpstream(t)
	cfg := testConfig(up.Addr())
	cfg.BreakerThreshold, cfg.BreakerMinSamples = 50, 4
	a := startProxy(t, cfg, guard.RealClock{})
	if r := ask(t, "udp", a.addr(), query("nx.example.com", dns.TypeA)); r.Rcode != dns.RcodeNameError {
		t.Errorf("NXDOMAIN came back as %s", rcodeName(r))
	}
	up.SetMode(fakeupstream.ServFail)
	for range 6 {
		if r := ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA)); r.Rcode != dns.RcodeServerFailure {
			t.Fatalf("upstream SERVFAIL came back as %s", rcodeName(r))
		}
	}
	// A well-formed SERVFAIL is an answer, not an upstream failure: the breaker stays closed.
	if s := a.breaker(0).State(); s != guard.Closed {
		t.Errorf("breaker %v after upstream SERVFAILs, want closed", s)
	}
	if got := count(a, "A", "forwarded", 7); got != 7 {
		t.Errorf("forwarded %d, want 7", got)
	}
}

func TestPipelinedTCPAnswersAsTheyComplete(t *testing.T) {
	up := startUpstream(t)
	up.SetDelay(300 * time.Millisecond)
	a := startProxy(t, testConfig(up.Addr()), guard.RealClock{})
	c, err := dns.Dial("tcp", a.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	slow, fast := query("slow.example.com", dns.TypeA), query("fast.example.com", dns.TypeA)
	slow.Id, fast.Id = 1, 2
	for _, m := range []*dns.Msg{slow, fast} {
		if err := c.WriteMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	var order []uint16
	for range 2 {
		r, err := c.ReadMsg()
		if err != nil {
			t.Fatal(err)
		}
		order = append(order, r.Id)
	}
	if order[0] != 2 || order[1] != 1 {
		t.Fatalf("answers came back as IDs %v, want [2 1]: the fast one must not wait behind the slow one", order)
	}
}

// A UDP answer larger than the client takes — 512 without EDNS, at most
// 1232 whatever it advertises — is TC with an empty answer section, never
// a partial RRset; over TCP it comes whole.
func TestTruncationToClientSize(t *testing.T) {
	up := startUpstream(t)
	a := startProxy(t, testConfig(up.Addr()), guard.RealClock{})

	tests := []struct {
		name, network string
		edns          uint16 // 0: none
		limit         int
		wantTC        bool
	}{
		{"no EDNS", "udp", 0, 512, true},
		{"EDNS 4096", "udp", 4096, 1232, true},
		{"EDNS 65535", "udp", 65535, 1232, true},
		{"TCP", "tcp", 0, 65535, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := query("big.example.com", dns.TypeTXT)
			if tt.edns > 0 {
				q.SetEdns0(tt.edns, false)
			}
			r := ask(t, tt.network, a.addr(), q)
			if size := r.Len(); size > tt.limit {
				t.Errorf("a %d-byte answer, over the client's %d", size, tt.limit)
			}
			if tt.wantTC && (!r.Truncated || len(r.Answer) != 0) {
				t.Errorf("TC=%v with %d records, want TC and an empty answer section", r.Truncated, len(r.Answer))
			}
			if !tt.wantTC && (r.Truncated || len(r.Answer) != 20) {
				t.Errorf("TC=%v with %d records, want the full 20", r.Truncated, len(r.Answer))
			}
		})
	}
}

// A TC answer from the upstream is relayed: the client comes back over
// TCP, and the proxy forwards that over TCP.
func TestUpstreamTruncatedIsRelayed(t *testing.T) {
	up := startUpstream(t)
	up.SetMode(fakeupstream.Truncate)
	a := startProxy(t, testConfig(up.Addr()), guard.RealClock{})
	r := ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA))
	if !r.Truncated || len(r.Answer) != 0 {
		t.Fatalf("TC=%v with %d answers, want the upstream's TC answer", r.Truncated, len(r.Answer))
	}
	if udp, tcp := up.Received(); udp != 1 || tcp != 0 {
		t.Fatalf("upstream saw %d UDP, %d TCP; want 1 and 0", udp, tcp)
	}
	r = ask(t, "tcp", a.addr(), query("www.example.com", dns.TypeA))
	if r.Truncated || len(r.Answer) != 1 {
		t.Fatalf("over TCP: TC=%v with %d answers, want the full answer", r.Truncated, len(r.Answer))
	}
	if udp, tcp := up.Received(); udp != 1 || tcp != 1 {
		t.Fatalf("upstream saw %d UDP, %d TCP; want 1 and 1", udp, tcp)
	}
}

// A reply with the wrong ID, one with the wrong question, then the real one:
// the client must see only the real one.
func TestOnlyMatchingRepliesReachTheClient(t *testing.T) {
	up := startUpstream(t)
	up.SetScript(func(req *dns.Msg, network string) [][]byte {
		wrongID := fakeupstream.Answer(req)
		wrongID.Id = req.Id + 1
		wrongID.Answer[0].(*dns.A).A = net.IPv4(198, 51, 100, 1)
		wrongQ := fakeupstream.Answer(req)
		wrongQ.Question[0].Name = "evil.example.com."
		wrongQ.Answer[0].(*dns.A).A = net.IPv4(198, 51, 100, 2)
		notReply := fakeupstream.Answer(req)
		notReply.Response = false
		notReply.Answer[0].(*dns.A).A = net.IPv4(198, 51, 100, 3)
		right := fakeupstream.Answer(req)
		var out [][]byte
		for _, m := range []*dns.Msg{wrongID, wrongQ, notReply, right} {
			b, _ := m.Pack()
			out = append(out, b)
		}
		return append(out, []byte("garbage after the answer"))
	})
	a := startProxy(t, testConfig(up.Addr()), guard.RealClock{})
	for _, network := range []string{"udp", "tcp"} {
		r := ask(t, network, a.addr(), query("www.example.com", dns.TypeA))
		if got := answerText(r); !strings.Contains(got, "192.0.2.1") || strings.Contains(got, "198.51.100") {
			t.Errorf("%s: client got %q, want only the real answer 192.0.2.1", network, got)
		}
	}
}

func TestBlackholeGivesServfailAfterTimeout(t *testing.T) {
	up := startUpstream(t)
	up.SetMode(fakeupstream.Blackhole)
	cfg := testConfig(up.Addr())
	cfg.UpstreamTimeout = 100 * time.Millisecond
	a := startProxy(t, cfg, guard.RealClock{})
	start := time.Now()
	r := ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA))
	if r.Rcode != dns.RcodeServerFailure {
		t.Fatalf("rcode %s, want SERVFAIL", rcodeName(r))
	}
	if took := time.Since(start); took < 100*time.Millisecond {
		t.Fatalf("SERVFAIL after %v, before the 100ms deadline", took)
	}
	if got := count(a, "A", "upstream_error", 1); got != 1 {
		t.Fatalf("upstream_error %d, want 1", got)
	}
}

func TestEntryGateThroughTheProxy(t *testing.T) {
	up := startUpstream(t)
	cfg := testConfig(up.Addr())
	cfg.RateLimit = RateLimit{Rate: 5, Burst: 5}
	clock := guard.NewManualClock(time.Now())
	a := startProxy(t, cfg, clock)

	// A query within the rate is answered; one beyond it is dropped, which
	// the rate_limited count shows the moment it happens: a client waiting
	// in vain for an answer would prove nothing.
	c, err := net.Dial("udp", a.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dropped := func(n int) {
		t.Helper()
		for range n {
			b, _ := query("www.example.com", dns.TypeA).Pack()
			c.Write(b)
		}
	}
	for range 5 {
		ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA))
	}
	dropped(3)
	if f, rl := count(a, "A", "forwarded", 5), count(a, "A", "rate_limited", 3); f != 5 || rl != 3 {
		t.Fatalf("forwarded %d, rate_limited %d; want 5 and 3", f, rl)
	}
	if up.Total() != 5 {
		t.Fatalf("the upstream saw %d queries, want 5: dropped ones never leave", up.Total())
	}
	clock.Advance(400 * time.Millisecond) // 5/s: two tokens
	for range 2 {
		ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA))
	}
	dropped(1)
	if f, rl := count(a, "A", "forwarded", 7), count(a, "A", "rate_limited", 4); f != 7 || rl != 4 {
		t.Fatalf("400 ms later: forwarded %d, rate_limited %d; want 7 and 4", f, rl)
	}
}

func TestForwardGateThroughTheProxy(t *testing.T) {
	up := startUpstream(t)
	up.SetMode(fakeupstream.Blackhole)
	cfg := testConfig(up.Addr())
	// The probe below is held at the upstream while the test asks three
	// more queries: on a loaded machine (-race, two cores) that took more
	// than 300 ms, and the probe timed out. 2 s; the four timeouts that
	// open the breaker run at once, so the wait is paid once.
	cfg.UpstreamTimeout = 2 * time.Second
	cfg.BreakerThreshold, cfg.BreakerMinSamples, cfg.BreakerCoolOff = 50, 4, time.Second
	clock := guard.NewManualClock(time.Now())
	a := startProxy(t, cfg, clock)

	trips := make(chan *dns.Msg, 4)
	for i := range 4 { // four timeouts: 100% failures at MinSamples (names of their own: none joins another)
		go func() {
			r, _ := tryAsk("udp", a.addr(), query(fmt.Sprintf("trip%d.example.com", i), dns.TypeA), 5*time.Second)
			trips <- r
		}()
	}
	for range 4 {
		if r := <-trips; r == nil || r.Rcode != dns.RcodeServerFailure {
			t.Fatalf("a query at the blackholed upstream: %v, want SERVFAIL", r)
		}
	}
	if s := a.breaker(0).State(); s != guard.Open {
		t.Fatalf("breaker %v after 4 timeouts, want open", s)
	}
	for range 5 {
		start := time.Now()
		r := ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA))
		if r.Rcode != dns.RcodeServerFailure || time.Since(start) >= cfg.UpstreamTimeout {
			t.Fatalf("open breaker: %s after %v, want SERVFAIL without waiting for the upstream", rcodeName(r), time.Since(start))
		}
	}
	if got := up.Total(); got != 4 {
		t.Fatalf("upstream saw %d queries, want 4: nothing while open", got)
	}
	if got := count(a, "A", "breaker_open", 5); got != 5 {
		t.Fatalf("breaker_open %d, want 5", got)
	}

	// The upstream heals and the cool-off passes: exactly one probe goes out.
	// The upstream holds the probe's answer until the test has checked that
	// everyone else is refused meanwhile.
	held, release := holdGate(t)
	up.SetScript(func(req *dns.Msg, _ string) [][]byte {
		<-held
		b, _ := fakeupstream.Answer(req).Pack()
		return [][]byte{b}
	})
	up.SetMode(fakeupstream.OK)
	clock.Advance(time.Second)
	probe := make(chan *dns.Msg, 1)
	go func() {
		r, _ := tryAsk("udp", a.addr(), query("www.example.com", dns.TypeA), 3*time.Second)
		probe <- r
	}()
	waitFor(t, "the probe to reach the upstream", func() bool { return up.Total() == 5 })
	for i := range 3 { // other names: the probe's own would wait for the probe's answer (coalesced)
		if r := ask(t, "udp", a.addr(), query(fmt.Sprintf("other%d.example.com", i), dns.TypeA)); r.Rcode != dns.RcodeServerFailure {
			t.Fatalf("while the probe is out: %s, want SERVFAIL", rcodeName(r))
		}
	}
	release()
	if r := <-probe; r == nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("the probe's answer: %v", r)
	}
	if got := up.Total(); got != 5 {
		t.Fatalf("upstream saw %d queries, want 5: exactly one probe", got)
	}
	if s := a.breaker(0).State(); s != guard.Closed {
		t.Fatalf("breaker %v after a good probe, want closed", s)
	}
	if r := ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA)); r.Rcode != dns.RcodeSuccess {
		t.Fatalf("closed again: %s", rcodeName(r))
	}
}

func TestMalformedQueriesDoNotStopService(t *testing.T) {
	up := startUpstream(t)
	a := startProxy(t, testConfig(up.Addr()), guard.RealClock{})
	header := func(id uint16, flags uint16, qd uint16) []byte {
		b := make([]byte, 12)
		binary.BigEndian.PutUint16(b, id)
		binary.BigEndian.PutUint16(b[2:], flags)
		binary.BigEndian.PutUint16(b[4:], qd)
		return b
	}
	question := func(name string) []byte {
		b := make([]byte, 0, 64)
		for _, l := range strings.Split(name, ".") {
			b = append(b, byte(len(l)))
			b = append(b, l...)
		}
		return append(b, 0, 0, 1, 0, 1)
	}
	loop := append(header(7, 0x0100, 1), 0xC0, 12, 0, 1, 0, 1) // the name points at itself
	tests := []struct {
		name      string
		pkt       []byte
		wantRcode int    // -1: no answer at all
		dropped   string // for no answer: the server's reason, counted when it drops the packet
	}{
		{"garbage", []byte("\x01\x02garbage"), -1, "malformed"},
		{"empty", nil, -1, "malformed"},
		{"header only, qdcount 1", header(1, 0x0100, 1), dns.RcodeFormatError, ""},
		{"qdcount 0", header(2, 0x0100, 0), dns.RcodeFormatError, ""},
		{"qdcount 2", append(append(header(3, 0x0100, 2), question("a.example")...), question("b.example")...), dns.RcodeFormatError, ""},
		{"compression loop", loop, dns.RcodeFormatError, ""},
		{"a response, not a query", append(header(5, 0x8100, 1), question("a.example")...), -1, "response"},
		{"label over 63", append(header(6, 0x0100, 1), append([]byte{64}, make([]byte, 70)...)...), dns.RcodeFormatError, ""},
		{"opcode NOTIFY", append(header(8, 0x2000, 1), question("a.example")...), dns.RcodeNotImplemented, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.wantRcode < 0 {
				drops := a.metrics.Dropped.WithLabelValues(tt.dropped)
				before := testutil.ToFloat64(drops)
				c, err := net.Dial("udp", a.addr())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.Write(tt.pkt)
				waitFor(t, "the server to drop it as "+tt.dropped, func() bool { return testutil.ToFloat64(drops) == before+1 })
			} else {
				got := sendRaw(t, a.addr(), tt.pkt, 3*time.Second)
				if len(got) < 12 {
					t.Fatalf("no answer, want %s", dns.RcodeToString[tt.wantRcode])
				}
				if id := binary.BigEndian.Uint16(got); id != binary.BigEndian.Uint16(tt.pkt) {
					t.Errorf("answer ID %d, want the query's", id)
				}
				if rc := int(got[3] & 0x0f); rc != tt.wantRcode || got[2]&0x80 == 0 {
					t.Errorf("rcode %s (QR %v), want %s", dns.RcodeToString[rc], got[2]&0x80 != 0, dns.RcodeToString[tt.wantRcode])
				}
			}
			// Whatever came before, an honest client is still answered.
			if r := ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA)); r.Rcode != dns.RcodeSuccess {
				t.Fatalf("after %s: %s", tt.name, rcodeName(r))
			}
		})
	}
	if up.Total() != int64(len(tests)) {
		t.Errorf("upstream saw %d queries, want only the %d honest ones", up.Total(), len(tests))
	}
}

func TestConcurrentClients(t *testing.T) {
	up := startUpstream(t)
	cfg := testConfig(up.Addr())
	cfg.BreakerThreshold = 50
	a := startProxy(t, cfg, guard.RealClock{})
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for c := range 8 {
		wg.Go(func() {
			for i := range 50 {
				network := "udp"
				if (c+i)%5 == 0 {
					network = "tcp"
				}
				q := query("www.example.com", dns.TypeA)
				r, err := tryAsk(network, a.addr(), q, 3*time.Second)
				if err == nil && (r.Id != q.Id || r.Rcode != dns.RcodeSuccess) {
					err = fmt.Errorf("reply ID %d rcode %s for query ID %d", r.Id, rcodeName(r), q.Id)
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := count(a, "A", "forwarded", 400); got != 400 {
		t.Errorf("forwarded %d, want 400", got)
	}
}

func TestInflightCapRefusesAtOnce(t *testing.T) {
	up := startUpstream(t)
	held, release := holdGate(t)
	up.SetScript(func(req *dns.Msg, _ string) [][]byte {
		<-held
		b, _ := fakeupstream.Answer(req).Pack()
		return [][]byte{b}
	})
	cfg := testConfig(up.Addr())
	cfg.MaxInflight = 1
	cfg.UpstreamTimeout = 5 * time.Second
	a := startProxy(t, cfg, guard.RealClock{})
	first := make(chan *dns.Msg, 1)
	go func() {
		r, _ := tryAsk("udp", a.addr(), query("www.example.com", dns.TypeA), 5*time.Second)
		first <- r
	}()
	waitFor(t, "the first query to reach the upstream", func() bool { return up.Total() == 1 })
	// The same query joins the one at the upstream without taking a place:
	// it adds no call.
	follower := make(chan *dns.Msg, 1)
	go func() {
		r, _ := tryAsk("udp", a.addr(), query("www.example.com", dns.TypeA), 5*time.Second)
		follower <- r
	}()
	waitFor(t, "the follower to join", func() bool { return testutil.ToFloat64(a.metrics.Coalesced) == 1 })
	start := time.Now()
	r := ask(t, "udp", a.addr(), query("other.example.com", dns.TypeA))
	if r.Rcode != dns.RcodeRefused {
		t.Fatalf("beyond the cap: %s, want REFUSED", rcodeName(r))
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("REFUSED took %v: it must not wait for a place", took)
	}
	if got := count(a, "A", "overloaded", 1); got != 1 {
		t.Fatalf("overloaded %d, want 1", got)
	}
	if up.Total() != 1 {
		t.Fatalf("the refused query reached the upstream")
	}
	release()
	if r := <-first; r == nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("the query within the cap: %v", r)
	}
	if r := <-follower; r == nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("the query that joined it: %v", r)
	}
	if r := ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA)); r.Rcode != dns.RcodeSuccess {
		t.Fatalf("after the place was freed: %s", rcodeName(r))
	}
}
