package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dnsproxi/dnsserver"
	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
	"dnsproxi/internal/wire"
	"dnsproxi/metrics"
	"dnsproxi/upstream"
)

// keyEcho is an upstream whose every answer says which query it answers:
// a TXT record, owned by the question's name, holding the query's key as
// the upstream saw it (the name lower-cased, type, class, RD, CD, DO,
// EDNS). It answers each query on a goroutine of its own after yielding a
// random number of times, so answers land in no set order; some end in
// SERVFAIL, some in a timeout, some are too large for UDP (TC over UDP).
type keyEcho struct {
	rng  *lockedRand
	sent atomic.Int64
}

type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func (l *lockedRand) IntN(n int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.IntN(n)
}

// keyText is what keyEcho writes for a query, and what a client expects
// for its own.
func keyText(name string, qtype, qclass uint16, rd, cd, do, edns bool) string {
	return fmt.Sprintf("%x|%d|%d|rd=%v|cd=%v|do=%v|edns=%v", strings.ToLower(name), qtype, qclass, rd, cd, do, edns)
}

func (k *keyEcho) Forward(query []byte, network string, done upstream.Result) {
	k.sent.Add(1)
	q := append([]byte(nil), query...)
	roll, yields, size := k.rng.IntN(100), k.rng.IntN(50), k.rng.IntN(4)
	go func() {
		for range yields {
			runtime.Gosched()
		}
		req := new(dns.Msg)
		if err := req.Unpack(q); err != nil {
			done(q, nil, upstream.ErrTimeout)
			return
		}
		b := keyEchoReply(req, network, roll, size)
		if b == nil {
			done(q, nil, upstream.ErrTimeout)
			return
		}
		binary.BigEndian.PutUint16(b, binary.BigEndian.Uint16(q))
		done(q, b, nil)
	}()
}

// keyEchoReply is keyEcho's reply to req over network: none (a timeout)
// for roll below 5, SERVFAIL below 12, else 1+12*size TXT records of req's
// key, compressed for an even roll, cut to TC over UDP if too large.
func keyEchoReply(req *dns.Msg, network string, roll, size int) []byte {
	opt := req.IsEdns0()
	do := opt != nil && opt.Do()
	qq := req.Question[0]
	m := new(dns.Msg)
	m.SetReply(req)
	m.RecursionAvailable = true
	m.AuthenticatedData = true
	m.Compress = roll%2 == 0
	switch {
	case roll < 5:
		return nil
	case roll < 12:
		m.Rcode = dns.RcodeServerFailure
	default:
		txt := keyText(qq.Name, qq.Qtype, qq.Qclass, req.RecursionDesired, req.CheckingDisabled, do, opt != nil)
		for range 1 + size*12 {
			m.Answer = append(m.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: qq.Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 2}, Txt: chunks(txt)})
		}
	}
	if opt != nil {
		m.SetEdns0(1232, do)
		m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_EDE{InfoCode: 0, ExtraText: "from upstream"}}
	}
	b, err := m.Pack()
	if err != nil {
		panic(err)
	}
	limit := 512
	if opt != nil {
		limit = int(opt.UDPSize())
	}
	if network != "tcp" && len(b) > limit {
		m.Answer, m.Truncated = nil, true
		if b, err = m.Pack(); err != nil {
			panic(err)
		}
	}
	return b
}

// chunks cuts s into TXT strings.
func chunks(s string) []string {
	var out []string
	for len(s) > 200 {
		out, s = append(out, s[:200]), s[200:]
	}
	return append(out, s)
}

// crossClient is one query of the churn and its writer.
type crossClient struct {
	waitingRecorder
	network string
	client  netip.AddrPort
	pkt     []byte
	msg     *dns.Msg
}

// Clients from many addresses ask for a few names in every case, with every
// combination of RD, CD, EDNS, DO, AD, UDP size and option, over UDP and
// TCP, while the cache (serve-stale, a 1 ms client-response timer,
// prefetch) ages under them and the upstream answers in any order, fails,
// times out or truncates. Every client must get exactly one answer: its
// own ID, its question byte for byte, its OPT (or none), within its size,
// and, whenever the answer carries records, the records of its own key —
// never those of a query that differs in name, type, class, RD, CD, DO or
// EDNS. Every query is counted once.
func TestAttackAnswersNeverCrossQueries(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := &lockedRand{r: rand.New(rand.NewPCG(seed, 7))}
	fwd := &keyEcho{rng: rng}
	m := metrics.New()
	clock := &setClock{}
	clock.set(tc0)
	cfg := withCache(Config{})
	cfg.CachePrefetch, cfg.CacheStaleWait = true, time.Millisecond
	answers, err := newAnswerCache(cfg, clock, m)
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{maxInflight: 100000, upstreams: onePool(fwd, nil), metrics: m, cache: answers, clock: clock}
	srv := &dnsserver.Server{Handler: dnsserver.HandlerFunc(func(w dnsserver.ResponseWriter, q *dnsserver.Query) {
		c := w.(*crossClient)
		q.Net, q.Client = c.network, c.client
		p.handleQuery(w, q)
	})}

	const workers, each = 8, 400
	var all []*crossClient
	var mu sync.Mutex
	var wg sync.WaitGroup
	var served atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				c := newCrossQuery(t, rng, w*each+i, false)
				mu.Lock()
				all = append(all, c)
				mu.Unlock()
				srv.ServePacket(c, c.pkt)
				if n := served.Add(1); n%150 == 0 {
					// Age the cache by half a TTL: entries pass through
					// their last tenth (prefetch), expiry (refresh, the
					// timer) and back.
					clock.set(clock.Now().Add(1100 * time.Millisecond))
				}
			}
		}()
	}
	wg.Wait()
	for i, c := range all {
		within(t, fmt.Sprintf("client %d's answer", i), c.done)
	}
	for i, c := range all {
		checkOwnAnswer(t, i, c)
	}
	total, by := 0, map[string]int{}
	for _, qt := range []string{"A", "AAAA", "TXT", "HTTPS", "OTHER"} {
		for _, o := range []string{"forwarded", "upstream_error", "cached", "stale"} {
			total += outcomes(p, qt, o)
			by[o] += outcomes(p, qt, o)
		}
	}
	t.Logf("outcomes %v", by)
	if total != len(all) {
		t.Errorf("%d queries counted under forwarded, upstream_error, cached and stale, want %d", total, len(all))
	}
	t.Logf("%d queries, %d upstream, %d coalesced", len(all), fwd.sent.Load(), int(testutil.ToFloat64(p.metrics.Coalesced)))
}

// crossNames, crossTypes and crossClasses are what the churn asks for:
// escaped bytes, the root, a name of 255 bytes, odd types and classes.
var (
	crossLong  = strings.Repeat("x", 63)
	crossNames = []string{"www.example.com.", "mail.example.com.", "a.b.", ".", `a\.b.example.`, `\000x.example.`,
		`\200\201q.example.`, crossLong + "." + crossLong + "." + crossLong + "." + strings.Repeat("y", 61) + "."}
	crossTypes   = []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeTXT, dns.TypeOPT, 65}
	crossClasses = []uint16{dns.ClassINET, dns.ClassCHAOS, dns.ClassANY}
)

// newCrossQuery is query i of the churn: a random name of crossNames in
// random case, type, class, RD, CD, AD, EDNS (size, DO, an option), over
// UDP or TCP, from 127.x.y.z.
func newCrossQuery(t *testing.T, rng *lockedRand, i int, narrow bool) *crossClient {
	t.Helper()
	names, types, classes := crossNames, crossTypes, 6
	if narrow { // fewer keys, so that identical queries overlap more
		names, types, classes = crossNames[:3], crossTypes[:2], 3
	}
	name := []byte(names[rng.IntN(len(names))])
	for j := range name {
		if rng.IntN(2) == 0 && name[j] >= 'a' && name[j] <= 'z' {
			name[j] -= 'a' - 'A'
		}
	}
	q := new(dns.Msg)
	q.Id = uint16(rng.IntN(1 << 16))
	q.Question = []dns.Question{{Name: string(name), Qtype: types[rng.IntN(len(types))], Qclass: crossClasses[rng.IntN(classes)/3]}}
	q.RecursionDesired = rng.IntN(4) != 0
	q.CheckingDisabled = rng.IntN(4) == 0
	q.AuthenticatedData = rng.IntN(3) == 0
	if rng.IntN(3) != 0 {
		q.SetEdns0(uint16(rng.IntN(4096)), rng.IntN(2) == 0)
		switch rng.IntN(3) {
		case 0:
			q.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"}}
		case 1:
			q.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_PADDING{Padding: make([]byte, rng.IntN(64))}}
		}
	}
	pkt, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	network := "udp"
	if rng.IntN(4) == 0 {
		network = "tcp"
	}
	c := &crossClient{network: network, pkt: pkt, msg: q,
		client: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, byte(i >> 16), byte(i >> 8), byte(i)}), 5300)}
	c.done = make(chan struct{})
	return c
}

// checkOwnAnswer fails unless c's one answer is its own.
func checkOwnAnswer(t *testing.T, i int, c *crossClient) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.out) != 1 || c.dropped != 0 {
		t.Fatalf("client %d: %d answers and %d drops, want one answer", i, len(c.out), c.dropped)
	}
	b := c.out[0]
	q := c.msg
	what := fmt.Sprintf("client %d (%s %s %s rd=%v cd=%v ad=%v edns=%v)", i, c.network, q.Question[0].Name,
		dns.TypeToString[q.Question[0].Qtype], q.RecursionDesired, q.CheckingDisabled, q.AuthenticatedData, q.IsEdns0() != nil)
	qend, _ := wire.QuestionEnd(c.pkt)
	if len(b) < qend || !bytes.Equal(b[:2], c.pkt[:2]) || !bytes.Equal(b[wire.HeaderLen:qend], c.pkt[wire.HeaderLen:qend]) {
		t.Fatalf("%s: the answer's ID or question is not the query's: % x", what, b[:min(len(b), qend)])
	}
	r := new(dns.Msg)
	if err := r.Unpack(b); err != nil {
		t.Fatalf("%s: the answer does not parse: %v", what, err)
	}
	qopt := q.IsEdns0()
	limit := dns.MaxMsgSize
	if c.network == "udp" {
		limit = 512
		if qopt != nil {
			limit = min(max(int(qopt.UDPSize()), 512), defaultMaxUDPSize)
		}
	}
	if len(b) > limit {
		t.Fatalf("%s: %d bytes, over its %d", what, len(b), limit)
	}
	ropt := r.IsEdns0()
	if (ropt != nil) != (qopt != nil) {
		t.Fatalf("%s: OPT %v in the answer", what, ropt != nil)
	}
	if ropt != nil {
		if ropt.Do() != qopt.Do() {
			t.Fatalf("%s: DO %v in the answer, %v in the query", what, ropt.Do(), qopt.Do())
		}
		for _, o := range ropt.Option {
			if o.Option() != dns.EDNS0EDE {
				t.Fatalf("%s: option %d in the answer", what, o.Option())
			}
		}
	}
	if r.RecursionDesired != q.RecursionDesired || r.CheckingDisabled != q.CheckingDisabled {
		t.Fatalf("%s: RD %v CD %v in the answer", what, r.RecursionDesired, r.CheckingDisabled)
	}
	if r.AuthenticatedData && !q.AuthenticatedData && (qopt == nil || !qopt.Do()) {
		t.Fatalf("%s: AD for a client that asked with neither AD nor DO", what)
	}
	qq := q.Question[0]
	want := keyText(qq.Name, qq.Qtype, qq.Qclass, q.RecursionDesired, q.CheckingDisabled, qopt != nil && qopt.Do(), qopt != nil)
	for _, rr := range r.Answer {
		txt, ok := rr.(*dns.TXT)
		if !ok || strings.Join(txt.Txt, "") != want {
			t.Fatalf("%s: answer record %v, want the TXT %q of its own key", what, rr, want)
		}
		if !strings.EqualFold(rr.Header().Name, qq.Name) {
			t.Fatalf("%s: answer record owned by %q", what, rr.Header().Name)
		}
	}
}

// The same churn through the whole proxy: real sockets from many 127.x
// addresses, the real upstream client (random IDs and ports, 0x20 with its
// owner names restored, byte-exact reply matching) and the pool, in front
// of an upstream on loopback answering every query with its own key;
// the cache on a manual clock that ages under the clients.
func TestAttackAnswersNeverCrossQueriesOverTheWire(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := &lockedRand{r: rand.New(rand.NewPCG(seed, 11))}
	up := startSlowEcho(t, rng, func(req *dns.Msg, network string) []byte {
		return keyEchoReply(req, network, rng.IntN(100), rng.IntN(4))
	})
	cfg := withCache(testConfig(up.addr()))
	cfg.CachePrefetch, cfg.CacheStaleWait = true, 100*time.Millisecond
	cfg.MaxInflight, cfg.TCPMaxConns = 100000, 1000
	clock := guard.NewManualClock(tc0)
	a := startProxy(t, cfg, clock)

	const workers, each = 64, 25
	var all []*crossClient
	var mu sync.Mutex
	var wg sync.WaitGroup
	var served atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				c := newCrossQuery(t, rng, 1+w*each+i, true)
				mu.Lock()
				all = append(all, c)
				mu.Unlock()
				if b := exchangeFrom(c.network, c.client.Addr(), a.addr(), c.pkt); b != nil {
					c.Write(b)
				}
				if n := served.Add(1); n%200 == 0 {
					clock.Advance(1100 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	unanswered := 0
	for i, c := range all {
		c.mu.Lock()
		n := c.n
		c.mu.Unlock()
		if n == 0 {
			unanswered++
			continue
		}
		checkOwnAnswer(t, i, c)
	}
	if unanswered > 0 {
		t.Errorf("%d of %d queries had no answer within 3 s", unanswered, len(all))
	}
	t.Logf("%d queries, upstream saw %d, %d coalesced", len(all), up.seen.Load(), int(testutil.ToFloat64(a.metrics.Coalesced)))
}

// exchangeFrom sends pkt over network from a socket bound to from and
// returns the answer, or nil after 3 s.
func exchangeFrom(network string, from netip.Addr, to string, pkt []byte) []byte {
	deadline := time.Now().Add(3 * time.Second)
	if network == "udp" {
		raddr, err := net.ResolveUDPAddr("udp", to)
		if err != nil {
			return nil
		}
		c, err := net.DialUDP("udp", &net.UDPAddr{IP: from.AsSlice()}, raddr)
		if err != nil {
			return nil
		}
		defer c.Close()
		c.SetDeadline(deadline)
		if _, err := c.Write(pkt); err != nil {
			return nil
		}
		buf := make([]byte, 65535)
		n, err := c.Read(buf)
		if err != nil {
			return nil
		}
		return buf[:n]
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: from.AsSlice()}, Deadline: deadline}
	c, err := d.Dial("tcp", to)
	if err != nil {
		return nil
	}
	defer c.Close()
	c.SetDeadline(deadline)
	if _, err := c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(pkt))), pkt...)); err != nil {
		return nil
	}
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		return nil
	}
	b := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(c, b); err != nil {
		return nil
	}
	return b
}

// slowEcho is an upstream on loopback, UDP and TCP on one port, that
// answers each query with answer(req, network) after a random latency of
// up to 20 ms, so that identical queries from many clients overlap at the
// upstream and replies land in any order.
type slowEcho struct {
	udp    *net.UDPConn
	tcp    *net.TCPListener
	answer func(req *dns.Msg, network string) []byte
	rng    *lockedRand
	seen   atomic.Int64
	wg     sync.WaitGroup
}

func startSlowEcho(t *testing.T, rng *lockedRand, answer func(req *dns.Msg, network string) []byte) *slowEcho {
	t.Helper()
	u, l, err := fakeupstream.ListenPair(&net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	s := &slowEcho{udp: u, tcp: l, answer: answer, rng: rng}
	s.wg.Add(2)
	go s.serveUDP()
	go s.serveTCP()
	t.Cleanup(func() {
		u.Close()
		l.Close()
		s.wg.Wait()
	})
	return s
}

func (s *slowEcho) addr() string { return s.udp.LocalAddr().String() }

// reply unpacks pkt and, after the latency, hands answer's reply to send.
func (s *slowEcho) reply(pkt []byte, network string, send func([]byte)) {
	s.seen.Add(1)
	req := new(dns.Msg)
	if req.Unpack(pkt) != nil || len(req.Question) != 1 {
		return
	}
	time.AfterFunc(time.Duration(s.rng.IntN(20000))*time.Microsecond, func() {
		if b := s.answer(req, network); b != nil {
			send(b)
		}
	})
}

func (s *slowEcho) serveUDP() {
	defer s.wg.Done()
	buf := make([]byte, 65535)
	for {
		n, from, err := s.udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		s.reply(append([]byte(nil), buf[:n]...), "udp", func(b []byte) { s.udp.WriteToUDPAddrPort(b, from) })
	}
}

func (s *slowEcho) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.tcp.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			var mu sync.Mutex
			for {
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				var l [2]byte
				if _, err := io.ReadFull(c, l[:]); err != nil {
					return
				}
				pkt := make([]byte, binary.BigEndian.Uint16(l[:]))
				if _, err := io.ReadFull(c, pkt); err != nil {
					return
				}
				s.reply(pkt, "tcp", func(b []byte) {
					mu.Lock()
					defer mu.Unlock()
					c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...))
				})
			}
		}()
	}
}
