package main

import (
	"encoding/binary"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dnsproxi/dnsserver"
	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
	"dnsproxi/metrics"
	"dnsproxi/upstream"
)

// scripted is a forwarder that keeps every query it is given and answers
// it at once with reply's packet (nil: a timeout), or, with hold set, keeps
// the completion until release.
type scripted struct {
	reply func(req *dns.Msg) []byte
	hold  bool

	mu      sync.Mutex
	queries [][]byte
	held    []func()
}

func (s *scripted) Forward(query []byte, _ string, done upstream.Result) {
	q := append([]byte(nil), query...)
	s.mu.Lock()
	s.queries = append(s.queries, q)
	s.mu.Unlock()
	answer := func() {
		req := new(dns.Msg)
		var r []byte
		if req.Unpack(q) == nil && s.reply != nil {
			r = s.reply(req)
		}
		if r == nil {
			done(q, nil, upstream.ErrTimeout)
			return
		}
		binary.BigEndian.PutUint16(r, binary.BigEndian.Uint16(q)) // as upstream.Forward reports it
		done(q, r, nil)
	}
	if !s.hold {
		answer()
		return
	}
	s.mu.Lock()
	s.held = append(s.held, answer)
	s.mu.Unlock()
}

// sent returns the queries forwarded so far.
func (s *scripted) sent() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]byte(nil), s.queries...)
}

// release completes every held query.
func (s *scripted) release() {
	s.mu.Lock()
	held := s.held
	s.held = nil
	s.mu.Unlock()
	for _, f := range held {
		f()
	}
}

// zone answers from the fake upstream's zone, changed by edit if set.
func zone(edit func(req, m *dns.Msg)) func(req *dns.Msg) []byte {
	return func(req *dns.Msg) []byte {
		m := fakeupstream.Answer(req)
		m.RecursionAvailable = true
		if edit != nil {
			edit(req, m)
		}
		b, err := m.Pack()
		if err != nil {
			panic(err)
		}
		return b
	}
}

// unitProxy is a proxy on fwd without a network, and a server that parses
// packets for it as if they came over UDP.
func unitProxy(limiter *guard.TokenBucket, fwd forwarder) (*proxy, *dnsserver.Server) {
	p := &proxy{limiter: limiter, maxInflight: 1000, upstreams: onePool(fwd, nil), metrics: metrics.New()}
	return p, &dnsserver.Server{Handler: dnsserver.HandlerFunc(p.handleQuery)}
}

// serveMsg serves m packed and returns the answer, unpacked (nil if dropped).
func serveMsg(t *testing.T, srv *dnsserver.Server, m *dns.Msg) (*dns.Msg, []byte) {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return servePkt(t, srv, b)
}

func servePkt(t *testing.T, srv *dnsserver.Server, pkt []byte) (*dns.Msg, []byte) {
	t.Helper()
	w := &recorder{}
	srv.ServePacket(w, pkt)
	if len(w.out)+w.dropped != 1 {
		t.Fatalf("%d answers and %d drops, want one of them", len(w.out), w.dropped)
	}
	if w.dropped == 1 {
		return nil, nil
	}
	r := new(dns.Msg)
	if err := r.Unpack(w.out[0]); err != nil {
		t.Fatalf("the answer does not parse: %v", err)
	}
	return r, w.out[0]
}

func ednsQuery(name string, qtype uint16, size uint16, do bool, opts ...dns.EDNS0) *dns.Msg {
	m := query(name, qtype)
	m.SetEdns0(size, do)
	m.IsEdns0().Option = opts
	return m
}

func outcomes(p *proxy, qtype, outcome string) int {
	return int(testutil.ToFloat64(p.metrics.Queries.WithLabelValues(qtype, outcome)))
}

var hopByHop = []dns.EDNS0{
	&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"},
	&dns.EDNS0_NSID{Code: dns.EDNS0NSID},
	&dns.EDNS0_PADDING{Padding: make([]byte, 40)},
	&dns.EDNS0_TCP_KEEPALIVE{Code: dns.EDNS0TCPKEEPALIVE},
}

// The upstream gets the proxy's own OPT — its size, the client's DO,
// version 0, no options — and none when the client sent none.
func TestUpstreamSeesTheProxysOPT(t *testing.T) {
	tests := []struct {
		name    string
		q       *dns.Msg
		wantOPT bool
		wantDO  bool
	}{
		{"cookie, NSID, padding, keepalive, 4096", ednsQuery("www.example.com", dns.TypeA, 4096, true, hopByHop...), true, true},
		{"65535 without DO", ednsQuery("www.example.com", dns.TypeA, 65535, false), true, false},
		{"no EDNS", query("www.example.com", dns.TypeA), false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fwd := &scripted{reply: zone(nil)}
			_, srv := unitProxy(nil, fwd)
			serveMsg(t, srv, tt.q)
			sent := fwd.sent()
			if len(sent) != 1 {
				t.Fatalf("%d queries upstream, want 1", len(sent))
			}
			up := new(dns.Msg)
			if err := up.Unpack(sent[0]); err != nil {
				t.Fatal(err)
			}
			opt := up.IsEdns0()
			if (opt != nil) != tt.wantOPT || len(up.Extra) > 1 {
				t.Fatalf("upstream query's additional section %v, want OPT: %v", up.Extra, tt.wantOPT)
			}
			if opt != nil && (opt.UDPSize() != 1232 || opt.Version() != 0 || opt.Do() != tt.wantDO || len(opt.Option) != 0) {
				t.Fatalf("upstream saw OPT %v, want size 1232, DO %v, version 0 and no options", opt, tt.wantDO)
			}
			if up.Question[0] != tt.q.Question[0] || up.RecursionDesired != tt.q.RecursionDesired {
				t.Fatalf("upstream saw %v, want the client's question and RD", up.Question)
			}
		})
	}
}

// Each client's answer has its own OPT, or none: the upstream's size,
// cookie and NSID stay on the upstream's hop; its Extended DNS Errors and
// extended RCODE reach the client.
func TestClientsGetTheirOwnOPT(t *testing.T) {
	upstreamOPT := func(req, m *dns.Msg) {
		m.Extra = nil // the zone's own OPT, if any
		m.SetEdns0(4096, true)
		m.IsEdns0().Option = []dns.EDNS0{
			&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "01020304050607080102030405060708"},
			&dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeStaleAnswer, ExtraText: "stale"},
			&dns.EDNS0_NSID{Code: dns.EDNS0NSID, Nsid: "6869"},
		}
	}
	const unassigned = 24 // an extended RCODE; BADVERS and BADCOOKIE are the proxy's to handle (answer_extrcode_test.go)
	extended := func(req, m *dns.Msg) {
		upstreamOPT(req, m)
		m.Answer = nil
		m.Rcode = unassigned
	}
	tests := []struct {
		name      string
		q         *dns.Msg
		edit      func(req, m *dns.Msg)
		wantOPT   bool
		wantDO    bool
		wantRcode int
	}{
		{"no EDNS, upstream sends OPT anyway", query("www.example.com", dns.TypeA), upstreamOPT, false, false, dns.RcodeSuccess},
		{"EDNS with DO", ednsQuery("www.example.com", dns.TypeA, 4096, true, hopByHop...), upstreamOPT, true, true, dns.RcodeSuccess},
		{"EDNS without DO", ednsQuery("www.example.com", dns.TypeA, 1232, false), upstreamOPT, true, false, dns.RcodeSuccess},
		{"extended RCODE", ednsQuery("www.example.com", dns.TypeA, 1232, false), extended, true, false, unassigned},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, srv := unitProxy(nil, &scripted{reply: zone(tt.edit)})
			r, _ := serveMsg(t, srv, tt.q)
			if r.Rcode != tt.wantRcode || r.Id != tt.q.Id {
				t.Fatalf("rcode %s ID %d, want %s and %d", rcodeName(r), r.Id, dns.RcodeToString[tt.wantRcode], tt.q.Id)
			}
			opt := r.IsEdns0()
			if (opt != nil) != tt.wantOPT {
				t.Fatalf("OPT %v, want one: %v", opt, tt.wantOPT)
			}
			if opt == nil {
				return
			}
			if opt.UDPSize() != 1232 || opt.Do() != tt.wantDO || opt.Version() != 0 || len(opt.Option) != 1 {
				t.Fatalf("OPT %v, want size 1232, the client's DO %v, and the upstream's EDE only", opt, tt.wantDO)
			}
			if ede, ok := opt.Option[0].(*dns.EDNS0_EDE); !ok || ede.InfoCode != dns.ExtendedErrorCodeStaleAnswer || ede.ExtraText != "stale" {
				t.Fatalf("option %v, want the upstream's EDE", opt.Option[0])
			}
		})
	}
}

// A client OPT with a version the proxy does not know gets BADVERS from
// the proxy itself (RFC 6891 §6.1.3).
func TestUnknownEDNSVersionGetsBADVERS(t *testing.T) {
	fwd := &scripted{reply: zone(nil)}
	p, srv := unitProxy(nil, fwd)
	q := ednsQuery("www.example.com", dns.TypeA, 1232, true)
	q.IsEdns0().SetVersion(1)
	r, _ := serveMsg(t, srv, q)
	if r.Rcode != dns.RcodeBadVers || r.IsEdns0() == nil || r.IsEdns0().Version() != 0 || len(r.Answer) != 0 {
		t.Fatalf("rcode %s with OPT %v, want BADVERS with an OPT of version 0", rcodeName(r), r.IsEdns0())
	}
	if len(fwd.sent()) != 0 {
		t.Fatal("a query of EDNS version 1 was forwarded")
	}
	if got := outcomes(p, "A", "formerr"); got != 1 {
		t.Fatalf("formerr %d, want 1", got)
	}
}

// UDP answers are cut to min(the client's size, 1232): one that does not
// fit, or an upstream answer with TC, is TC with empty sections — never a
// partial RRset. Over TCP nothing is cut.
func TestUDPAnswerSizes(t *testing.T) {
	big := func(req, m *dns.Msg) { // 20 TXT records of about 100 bytes, whatever the size asked
		m.Answer = nil
		for i := range 20 {
			m.Answer = append(m.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: req.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 60},
				Txt: []string{strings.Repeat("x", 96)}})
			_ = i
		}
	}
	cut := func(req, m *dns.Msg) { // what an upstream sends when it truncates: TC and part of the answer
		big(req, m)
		m.Answer, m.Truncated = m.Answer[:3], true
	}
	tests := []struct {
		name    string
		q       *dns.Msg
		edit    func(req, m *dns.Msg)
		limit   int
		wantTC  bool
		wantOPT bool
	}{
		{"65535 advertised, 2 KB answer", ednsQuery("big.example.com", dns.TypeTXT, 65535, false), big, 1232, true, true},
		{"4096 advertised, 2 KB answer", ednsQuery("big.example.com", dns.TypeTXT, 4096, true), big, 1232, true, true},
		{"no EDNS, 2 KB answer", query("big.example.com", dns.TypeTXT), big, 512, true, false},
		{"no EDNS, upstream TC with 3 records", query("big.example.com", dns.TypeTXT), cut, 512, true, false},
		{"EDNS 1232, upstream TC with 3 records", ednsQuery("big.example.com", dns.TypeTXT, 1232, false), cut, 1232, true, true},
		{"EDNS 100 counts as 512", ednsQuery("www.example.com", dns.TypeA, 100, false), nil, 512, false, true},
		{"a small answer fits", ednsQuery("www.example.com", dns.TypeA, 65535, false), nil, 1232, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, srv := unitProxy(nil, &scripted{reply: zone(tt.edit)})
			tt.q.Question[0].Name = strings.ToUpper(tt.q.Question[0].Name[:1]) + tt.q.Question[0].Name[1:]
			r, raw := serveMsg(t, srv, tt.q)
			if len(raw) > tt.limit {
				t.Fatalf("a %d-byte UDP answer, over %d", len(raw), tt.limit)
			}
			if r.Truncated != tt.wantTC || (r.IsEdns0() != nil) != tt.wantOPT {
				t.Fatalf("TC %v with OPT %v, want TC %v and OPT %v", r.Truncated, r.IsEdns0(), tt.wantTC, tt.wantOPT)
			}
			if tt.wantTC && (len(r.Answer)+len(r.Ns) != 0 || len(r.Extra) > 1) {
				t.Fatalf("a TC answer with %d answer, %d authority, %d additional records, want none but the OPT",
					len(r.Answer), len(r.Ns), len(r.Extra))
			}
			if !tt.wantTC && len(r.Answer) == 0 {
				t.Fatal("an answer that fits lost its records")
			}
			if r.Question[0] != tt.q.Question[0] || r.Id != tt.q.Id {
				t.Fatalf("question %v ID %d, want the client's %v %d", r.Question[0], r.Id, tt.q.Question[0], tt.q.Id)
			}
		})
	}
}

// A query with two OPT records, or bytes after its last record, is
// answered FORMERR, and not forwarded.
func TestQueriesThatDoNotParseGetFormErr(t *testing.T) {
	b, _ := ednsQuery("www.example.com", dns.TypeA, 1232, false).Pack()
	twoOPT := append(append([]byte(nil), b...), b[len(b)-11:]...)
	twoOPT[11] = 2
	trailing := append(append([]byte(nil), b...), 0, 0)
	plainTrailing, _ := query("www.example.com", dns.TypeA).Pack()
	plainTrailing = append(plainTrailing, 0xFF)
	for _, tt := range []struct {
		name string
		pkt  []byte
	}{{"two OPT records", twoOPT}, {"trailing bytes after the OPT", trailing}, {"trailing bytes after the question", plainTrailing}} {
		t.Run(tt.name, func(t *testing.T) {
			fwd := &scripted{reply: zone(nil)}
			p, srv := unitProxy(nil, fwd)
			r, _ := servePkt(t, srv, tt.pkt)
			if r == nil || r.Rcode != dns.RcodeFormatError {
				t.Fatalf("answer %v, want FORMERR", r)
			}
			if len(fwd.sent()) != 0 {
				t.Fatal("forwarded")
			}
			if got := outcomes(p, "OTHER", "formerr"); got != 1 {
				t.Fatalf("formerr %d, want 1", got)
			}
		})
	}
}

// The proxy's own answers carry an OPT when the client sent one, the
// client's CD and RD, and claim RA only while the upstream does.
func TestOwnAnswers(t *testing.T) {
	withRA := true
	fwd := &scripted{reply: zone(func(req, m *dns.Msg) { m.RecursionAvailable = withRA })}
	_, srv := unitProxy(nil, fwd)
	notify := func(edns bool) *dns.Msg {
		q := query("www.example.com", dns.TypeSOA)
		if edns {
			q.SetEdns0(4096, true)
		}
		q.Opcode, q.CheckingDisabled = dns.OpcodeNotify, true
		return q
	}
	check := func(t *testing.T, r *dns.Msg, wantOPT, wantRA bool) {
		t.Helper()
		if r.Rcode != dns.RcodeNotImplemented || !r.CheckingDisabled || !r.RecursionDesired {
			t.Fatalf("%s CD %v RD %v, want NOTIMP with the query's CD and RD", rcodeName(r), r.CheckingDisabled, r.RecursionDesired)
		}
		if opt := r.IsEdns0(); (opt != nil) != wantOPT || (opt != nil && (opt.UDPSize() != 1232 || !opt.Do())) {
			t.Fatalf("OPT %v, want one %v (size 1232, the query's DO)", opt, wantOPT)
		}
		if r.RecursionAvailable != wantRA {
			t.Fatalf("RA %v, want %v", r.RecursionAvailable, wantRA)
		}
	}
	t.Run("before any upstream answer", func(t *testing.T) {
		r, _ := serveMsg(t, srv, notify(true))
		check(t, r, true, true)
		r, _ = serveMsg(t, srv, notify(false))
		check(t, r, false, true)
	})
	t.Run("after an upstream answer without RA", func(t *testing.T) {
		withRA = false
		serveMsg(t, srv, query("www.example.com", dns.TypeA))
		r, _ := serveMsg(t, srv, notify(true))
		check(t, r, true, false)
	})
	t.Run("after one with RA again", func(t *testing.T) {
		withRA = true
		serveMsg(t, srv, query("www.example.com", dns.TypeA))
		r, _ := serveMsg(t, srv, notify(true))
		check(t, r, true, true)
	})
}

// AD reaches only a client that set AD or DO (RFC 6840 §5.8), whatever
// the upstream says.
func TestADOnlyForClientsThatAsk(t *testing.T) {
	fwd := &scripted{reply: zone(func(req, m *dns.Msg) { m.AuthenticatedData = true })}
	_, srv := unitProxy(nil, fwd)
	for _, tt := range []struct {
		name   string
		ad, do bool
		want   bool
	}{{"neither", false, false, false}, {"AD", true, false, true}, {"DO", false, true, true}} {
		t.Run(tt.name, func(t *testing.T) {
			q := ednsQuery("www.example.com", dns.TypeA, 1232, tt.do)
			q.AuthenticatedData = tt.ad
			if r, _ := serveMsg(t, srv, q); r.AuthenticatedData != tt.want {
				t.Fatalf("AD %v, want %v", r.AuthenticatedData, tt.want)
			}
		})
	}
}

// Malformed queries pay the entry gate like every other: with a bucket of
// 5 and no time passing, 20 of them get at most 5 answers.
func TestMalformedQueriesPayTheEntryGate(t *testing.T) {
	clock := guard.NewManualClock(time.Unix(1e9, 0))
	p, srv := unitProxy(guard.NewTokenBucket(1, 5, clock), &scripted{reply: zone(nil)})
	b, _ := query("www.example.com", dns.TypeA).Pack()
	answered := 0
	for i := range 20 {
		pkt := append([]byte(nil), b[:len(b)-1]...) // the question is cut short
		binary.BigEndian.PutUint16(pkt, uint16(i))
		w := &recorder{}
		srv.ServePacket(w, pkt)
		answered += len(w.out)
		if len(w.out)+w.dropped != 1 {
			t.Fatalf("packet %d: %d answers, %d drops", i, len(w.out), w.dropped)
		}
	}
	if answered > 5 {
		t.Fatalf("%d of 20 malformed packets answered with a bucket of 5", answered)
	}
	if f, rl := outcomes(p, "OTHER", "formerr"), outcomes(p, "OTHER", "rate_limited"); f != answered || f+rl != 20 {
		t.Fatalf("formerr %d, rate_limited %d; want %d and the rest of 20", f, rl, answered)
	}
}

// Zone transfers are refused, REFUSED with their own outcome, and never
// reach the upstream: relayed over UDP they would be cut.
func TestZoneTransfersRefused(t *testing.T) {
	for _, qtype := range []uint16{dns.TypeAXFR, dns.TypeIXFR} {
		t.Run(dns.TypeToString[qtype], func(t *testing.T) {
			fwd := &scripted{reply: zone(nil)}
			p, srv := unitProxy(nil, fwd)
			q := ednsQuery("example.com", qtype, 1232, false)
			r, _ := serveMsg(t, srv, q)
			if r == nil || r.Rcode != dns.RcodeRefused || r.IsEdns0() == nil {
				t.Fatalf("answer %v, want REFUSED with an OPT", r)
			}
			if len(fwd.sent()) != 0 {
				t.Fatal("a zone transfer was forwarded")
			}
			if got := outcomes(p, "OTHER", "transfer_refused"); got != 1 {
				t.Fatalf("transfer_refused %d, want 1", got)
			}
		})
	}
}
