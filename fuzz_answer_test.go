package main

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/miekg/dns"

	"dnsproxi/dnsserver"
	"dnsproxi/internal/wire"
	"dnsproxi/upstream"
)

// replyForwarder answers every query with reply: the fuzzer's bytes as the
// upstream's, with the query's ID as upstream.Forward reports it.
type replyForwarder struct{ reply []byte }

func (r *replyForwarder) Forward(query []byte, _ string, done upstream.Result) {
	b := append([]byte(nil), r.reply...)
	if len(b) >= 2 {
		copy(b, query[:2])
	}
	done(query, b, nil)
}

// fuzzClients are the queries a fuzzed reply answers: without EDNS, with a
// small size, with DO and a large size, with AD.
func fuzzClients() [][]byte {
	var out [][]byte
	for i, m := range []*dns.Msg{
		query("wWw.example.COM", dns.TypeA),
		ednsQuery("www.Example.com", dns.TypeTXT, 512, false),
		ednsQuery("WWW.example.com", dns.TypeA, 65535, true),
		ednsQuery("www.example.com", dns.TypeAAAA, 1232, false),
	} {
		m.Id = uint16(0x1000 + i)
		m.AuthenticatedData = i == 3
		b, _ := m.Pack()
		out = append(out, b)
	}
	return out
}

// FuzzUpstreamReply feeds arbitrary bytes as the upstream's reply — a
// header, then the client's question, then whatever the fuzzer writes —
// through the answer-building path (OPT replaced, EDE kept, truncation,
// the client's question and ID). Whatever comes: no panic, one answer,
// never larger than the client takes, with the client's ID and question
// bytes, and framed soundly: every record the header counts is there,
// nothing after them, one OPT at most and only for a client that sent one.
func FuzzUpstreamReply(f *testing.F) {
	for i, c := range fuzzClients() {
		req := new(dns.Msg)
		req.Unpack(c)
		for _, edit := range []func(m *dns.Msg){
			func(m *dns.Msg) {},
			func(m *dns.Msg) { m.Truncated = true },
			func(m *dns.Msg) {
				m.SetEdns0(4096, true)
				m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_EDE{InfoCode: 3, ExtraText: "stale"}, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"}}
				m.Rcode = dns.RcodeBadCookie
			},
			func(m *dns.Msg) {
				for range 30 {
					m.Answer = append(m.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: m.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 60}, Txt: []string{"0123456789012345678901234567890123456789"}})
				}
			},
		} {
			m := zone(func(_, m *dns.Msg) { m.Extra = nil; edit(m) })(req)
			qend, _ := wire.QuestionEnd(m)
			f.Add(byte(i), append(append([]byte(nil), m[:wire.HeaderLen]...), m[qend:]...))
		}
	}
	clients := fuzzClients()
	f.Fuzz(func(t *testing.T, which byte, rest []byte) {
		query := clients[int(which)%len(clients)]
		qend, _ := wire.QuestionEnd(query)
		var reply []byte
		if len(rest) >= wire.HeaderLen {
			reply = append(append(append(reply, rest[:wire.HeaderLen]...), query[wire.HeaderLen:qend]...), rest[wire.HeaderLen:]...)
			binary.BigEndian.PutUint16(reply[4:], 1)
		} else {
			reply = rest
		}
		p, _ := unitProxy(nil, &replyForwarder{reply: reply})
		srv := &dnsserver.Server{Handler: dnsserver.HandlerFunc(p.handleQuery)}
		w := &recorder{}
		srv.ServePacket(w, query)
		if len(w.out) != 1 || w.dropped != 0 {
			t.Fatalf("%d answers, %d drops; want one answer", len(w.out), w.dropped)
		}
		ans := w.out[0]
		size := 512
		sent := new(dns.Msg)
		sent.Unpack(query)
		if opt := sent.IsEdns0(); opt != nil {
			size = min(max(int(opt.UDPSize()), 512), 1232)
		}
		if len(ans) > size {
			t.Fatalf("a %d-byte answer for a client that takes %d", len(ans), size)
		}
		if len(ans) < qend || wire.ID(ans) != wire.ID(query) || wire.Flags(ans)&wire.FlagQR == 0 || !bytes.Equal(ans[wire.HeaderLen:qend], query[wire.HeaderLen:qend]) {
			t.Fatalf("answer %x does not carry the client's ID, QR and question", ans)
		}
		if qd, _, _, _ := wire.Counts(ans); qd != 1 {
			t.Fatalf("%d questions", qd)
		}
		sec, ok := wire.ReadSections(ans, qend)
		if !ok || sec.End != len(ans) || sec.AfterOPT != 0 || sec.OPT.Present != (sent.IsEdns0() != nil) {
			t.Fatalf("answer framed badly (%v): %+v in %d bytes: %x", ok, sec, len(ans), ans)
		}
		if sec.AN+sec.NS+sec.AR == 0 {
			if err := new(dns.Msg).Unpack(ans); err != nil { // no record of the upstream's: it must parse whole
				t.Fatalf("the proxy's own answer does not parse: %v", err)
			}
		}
	})
}
