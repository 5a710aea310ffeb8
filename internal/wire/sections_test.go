package wire

import (
	"bytes"
	"testing"

	"github.com/miekg/dns"
)

func TestReadSections(t *testing.T) {
	withOPT := func(m *dns.Msg, opts ...dns.EDNS0) *dns.Msg {
		m.SetEdns0(1232, true)
		m.IsEdns0().Option = opts
		return m
	}
	q := func() *dns.Msg { return new(dns.Msg).SetQuestion("www.example.com.", dns.TypeA) }
	reply := func() *dns.Msg {
		r := new(dns.Msg).SetReply(q())
		rr, _ := dns.NewRR("www.example.com. 60 IN CNAME host.example.com.")
		a, _ := dns.NewRR("host.example.com. 60 IN A 192.0.2.1")
		ns, _ := dns.NewRR("example.com. 60 IN NS ns.example.com.")
		r.Answer, r.Ns = []dns.RR{rr, a}, []dns.RR{ns}
		return r
	}
	twoOPT := pack(t, withOPT(q()))
	twoOPT = append(twoOPT, twoOPT[len(twoOPT)-11:]...)
	SetCounts(twoOPT, 1, 0, 0, 2)
	optInAnswer := pack(t, withOPT(q()))
	SetCounts(optInAnswer, 1, 1, 0, 0)
	badOwner := pack(t, withOPT(q()))
	badOwner = append(append(append([]byte(nil), badOwner[:len(badOwner)-11]...), 1, 'x', 0), badOwner[len(badOwner)-10:]...)
	badOption := pack(t, withOPT(q(), &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"}))
	badOption[len(badOption)-10]++ // the option claims a byte more than there is
	tsigAfterOPT := withOPT(reply())
	tsigAfterOPT.Extra = append(tsigAfterOPT.Extra, &dns.TXT{Hdr: dns.RR_Header{Name: "k.", Rrtype: dns.TypeTXT, Class: dns.ClassINET}, Txt: []string{"x"}})
	tests := []struct {
		name             string
		msg              []byte
		ok               bool
		an, ns, ar, afer int
		opt              EDNS
		endAtLen         bool
	}{
		{"plain query", pack(t, q()), true, 0, 0, 0, 0, EDNS{}, true},
		{"query with OPT", pack(t, withOPT(q())), true, 0, 0, 0, 0, EDNS{Present: true, Size: 1232, DO: true}, true},
		{"ECS", pack(t, withOPT(q(), &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: []byte{192, 0, 2, 0}})), true, 0, 0, 0, 0,
			EDNS{Present: true, Size: 1232, DO: true, ECS: true}, true},
		{"compressed reply", pack(t, withOPT(reply())), true, 2, 1, 0, 0, EDNS{Present: true, Size: 1232, DO: true}, true},
		{"record after the OPT", pack(t, tsigAfterOPT), true, 2, 1, 1, 1, EDNS{Present: true, Size: 1232, DO: true}, true},
		{"trailing bytes", append(pack(t, q()), 0), true, 0, 0, 0, 0, EDNS{}, false},
		{"two OPT records", twoOPT, false, 0, 0, 0, 0, EDNS{}, false},
		{"OPT in the answer section", optInAnswer, false, 0, 0, 0, 0, EDNS{}, false},
		{"OPT owned by x.", badOwner, false, 0, 0, 0, 0, EDNS{}, false},
		{"option overruns", badOption, false, 0, 0, 0, 0, EDNS{}, false},
		{"record cut", pack(t, withOPT(q()))[:len(pack(t, withOPT(q())))-1], false, 0, 0, 0, 0, EDNS{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			end, _ := QuestionEnd(tt.msg)
			s, ok := ReadSections(tt.msg, end)
			if ok != tt.ok {
				t.Fatalf("ok = %v, want %v", ok, tt.ok)
			}
			if !ok {
				return
			}
			if s.AN != tt.an || s.NS != tt.ns || s.AR != tt.ar || s.AfterOPT != tt.afer || s.OPT != tt.opt {
				t.Fatalf("sections %+v", s)
			}
			if (s.End == len(tt.msg)) != tt.endAtLen {
				t.Fatalf("End %d of %d bytes", s.End, len(tt.msg))
			}
		})
	}
}

func TestExtendedRcodeIsReadFromTheOPT(t *testing.T) {
	m := new(dns.Msg).SetQuestion("example.com.", dns.TypeA)
	m.Response = true
	m.SetEdns0(4096, false)
	m.Rcode = dns.RcodeBadCookie // 23: 7 in the header, 1 in the OPT's TTL
	b := pack(t, m)
	end, _ := QuestionEnd(b)
	s, ok := ReadSections(b, end)
	if !ok || s.OPT.ExtRcode != 1 || int(Flags(b)&0xF) != 7 {
		t.Fatalf("%v %+v", ok, s)
	}
}

func TestAppendOPTAndOptions(t *testing.T) {
	m := new(dns.Msg).SetQuestion("example.com.", dns.TypeA)
	m.Response = true
	m.SetEdns0(4096, true)
	m.IsEdns0().Option = []dns.EDNS0{
		&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"},
		&dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeStaleAnswer, ExtraText: "old"},
		&dns.EDNS0_NSID{Code: dns.EDNS0NSID, Nsid: "6869"},
		&dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeDNSBogus},
	}
	b := pack(t, m)
	end, _ := QuestionEnd(b)
	s, _ := ReadSections(b, end)
	ede := AppendOptions(nil, b[s.OPTData:s.OPTEnd], OptionEDE, 2)
	out := AppendOPT(append([]byte(nil), b[:s.OPTStart]...), 1232, 1, true, ede)
	SetCounts(out, 1, 0, 0, 1)
	r := new(dns.Msg)
	if err := r.Unpack(out); err != nil {
		t.Fatal(err)
	}
	opt := r.IsEdns0()
	if opt == nil || opt.UDPSize() != 1232 || !opt.Do() || opt.Version() != 0 || len(opt.Option) != 2 {
		t.Fatalf("OPT %v", opt)
	}
	for i, want := range []uint16{dns.ExtendedErrorCodeStaleAnswer, dns.ExtendedErrorCodeDNSBogus} {
		if e, ok := opt.Option[i].(*dns.EDNS0_EDE); !ok || e.InfoCode != want {
			t.Fatalf("option %d: %v", i, opt.Option[i])
		}
	}
	if r.Rcode != 16 { // extended RCODE 1, header 0: BADVERS
		t.Fatalf("rcode %d, want 16", r.Rcode)
	}
}

func TestKey(t *testing.T) {
	question := func(name string, qtype uint16) []byte {
		return pack(t, new(dns.Msg).SetQuestion(name, qtype))[HeaderLen:]
	}
	var a, b Key
	tests := []struct {
		name         string
		qa, qb       []byte
		bitsA, bitsB byte
		equal        bool
	}{
		{"case", question("WWW.example.com.", dns.TypeA), question("www.EXAMPLE.com.", dns.TypeA), KeyRD, KeyRD, true},
		{"type", question("www.example.com.", dns.TypeA), question("www.example.com.", dns.TypeAAAA), KeyRD, KeyRD, false},
		{"type 65 and 97", question("a.", 65), question("a.", 97), 0, 0, false},
		{"DO", question("a.", 1), question("a.", 1), KeyEDNS | KeyDO, KeyEDNS, false},
		{"CD", question("a.", 1), question("a.", 1), KeyCD, 0, false},
		{"EDNS", question("a.", 1), question("a.", 1), KeyEDNS, 0, false},
		{"RD", question("a.", 1), question("a.", 1), KeyRD, 0, false},
		{"name", question("a.", 1), question("b.", 1), 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !a.Set(tt.qa, tt.bitsA) || !b.Set(tt.qb, tt.bitsB) {
				t.Fatal("Set refused a question")
			}
			if a.Equal(&b) != tt.equal || (tt.equal && a.Hash != b.Hash) {
				t.Fatalf("Equal = %v, want %v", a.Equal(&b), tt.equal)
			}
		})
	}
	if a.Set(make([]byte, MaxQuestionLen+1), 0) || a.Set([]byte{0, 0, 1}, 0) {
		t.Fatal("Set took a question of impossible length")
	}
	q := question("www.example.com.", dns.TypeA)
	if n := testing.AllocsPerRun(100, func() { a.Set(q, KeyRD); b.Set(q, KeyRD); _ = a.Equal(&b) }); n != 0 {
		t.Fatalf("%v allocations to set and compare keys, want 0", n)
	}
	if !bytes.Equal(q, question("www.example.com.", dns.TypeA)) {
		t.Fatal("Set changed the question")
	}
}

// Relayed leaves behind the OPT record and a transaction signature — a
// TSIG, or a SIG covering type 0 (SIG(0)), and only as the last record —
// with whatever follows them; a SIG covering a real type is data.
func TestRelayedLeavesTheHopBehind(t *testing.T) {
	reply := func() *dns.Msg {
		q := new(dns.Msg).SetQuestion("www.example.com.", dns.TypeA)
		r := new(dns.Msg).SetReply(q)
		a, _ := dns.NewRR("www.example.com. 60 IN A 192.0.2.1")
		glue, _ := dns.NewRR("ns.example.com. 60 IN A 192.0.2.53")
		r.Answer, r.Extra = []dns.RR{a}, []dns.RR{glue}
		return r
	}
	tsig := &dns.TSIG{Hdr: dns.RR_Header{Name: "key.", Rrtype: dns.TypeTSIG, Class: dns.ClassANY},
		Algorithm: dns.HmacSHA256, Fudge: 300, MACSize: 4, MAC: "01020304"}
	sig := func(covered uint16) dns.RR {
		return &dns.SIG{RRSIG: dns.RRSIG{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeSIG, Class: dns.ClassANY},
			TypeCovered: covered, Algorithm: dns.ECDSAP256SHA256, SignerName: "example.com.", Signature: "QUFB"}}
	}
	with := func(extra ...dns.RR) []byte {
		r := reply()
		r.Extra = append(r.Extra, extra...)
		return pack(t, r)
	}
	withOPT := func(extra ...dns.RR) []byte {
		r := reply()
		r.SetEdns0(1232, false)
		r.Extra = append(r.Extra, extra...)
		return pack(t, r)
	}
	plain := pack(t, reply())
	tests := []struct {
		name string
		msg  []byte
		ar   int  // additional records relayed
		cut  bool // relayed up to the glue's end: everything after it left behind
	}{
		{"no OPT, no signature", plain, 1, false},
		{"TSIG last", with(tsig), 1, true},
		{"SIG(0) last", with(sig(0)), 1, true},
		{"SIG covering A is data", with(sig(dns.TypeA)), 2, false},
		{"TSIG not last is data", with(tsig, sig(dns.TypeA)), 3, false},
		{"OPT then TSIG", withOPT(tsig), 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			qend, _ := QuestionEnd(tt.msg)
			s, ok := ReadSections(tt.msg, qend)
			if !ok {
				t.Fatal("does not read")
			}
			end, ar := s.Relayed()
			if ar != tt.ar {
				t.Errorf("%d additional records relayed, want %d", ar, tt.ar)
			}
			want := s.End // every record
			if tt.cut {
				want = len(plain) // the records before the OPT or signature: those of the plain reply
			}
			if end != want {
				t.Errorf("relayed up to %d of %d bytes, want %d", end, s.End, want)
			}
		})
	}
}
