package wire

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/miekg/dns"
)

// namesQuestion is a reply header and the question www.example.com. A:
// its labels start at 12 (www), 16 (example) and 24 (com), and it ends
// at namesQEnd.
func namesQuestion(tb testing.TB) []byte {
	tb.Helper()
	m := new(dns.Msg).SetQuestion("www.example.com.", dns.TypeA)
	m.Response = true
	b, err := m.Pack()
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

const namesQEnd = HeaderLen + 17 + 4

// record is a record of type typ, TTL 60, owned by owner (wire form), with
// rdata.
func record(owner []byte, typ uint16, rdata []byte) []byte {
	b := append([]byte(nil), owner...)
	b = binary.BigEndian.AppendUint16(b, typ)
	b = binary.BigEndian.AppendUint16(b, dns.ClassINET)
	b = binary.BigEndian.AppendUint32(b, 60)
	b = binary.BigEndian.AppendUint16(b, uint16(len(rdata)))
	return append(b, rdata...)
}

// pointer is a compression pointer to off.
func pointer(off int) []byte { return binary.BigEndian.AppendUint16(nil, 0xC000|uint16(off)) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// label is one label of n letters x.
func label(n int) []byte { return append([]byte{byte(n)}, bytes.Repeat([]byte{'x'}, n)...) }

// withRecords is the question followed by records, counted in the answer
// section.
func withRecords(tb testing.TB, records ...[]byte) []byte {
	tb.Helper()
	b := append(namesQuestion(tb), cat(records...)...)
	SetCounts(b, 1, len(records), 0, 0)
	return b
}

// chain is n+1 records: the first owned by "x.", each next by "x." and a
// pointer to the one before, so the last's owner is n+1 labels reached
// through n pointers; then one owned by a pointer to the last, n+1 hops.
func chain(tb testing.TB, n int) []byte {
	tb.Helper()
	a := []byte{192, 0, 2, 1}
	recs := [][]byte{record(cat(label(1), []byte{0}), dns.TypeA, a)}
	off := namesQEnd
	for range n {
		prev := off
		off += len(recs[len(recs)-1])
		recs = append(recs, record(cat(label(1), pointer(prev)), dns.TypeA, a))
	}
	return withRecords(tb, append(recs, record(pointer(off), dns.TypeA, a))...)
}

// TestNamesReadable: names as compressors write them read; a pointer
// anywhere but at a label of an earlier name, a name over 255 octets or
// over 126 pointers, and RDATA that its names and fixed fields do not fill
// do not. Every message it accepts, miekg/dns reads too.
func TestNamesReadable(t *testing.T) {
	a := []byte{192, 0, 2, 1}
	long := cat(label(63), label(63), label(63), pointer(12)) // 192 + 16 octets
	soa := cat(pointer(16), label(3), pointer(16), make([]byte, 20))
	tests := []struct {
		name string
		msg  []byte
		ok   bool
	}{
		{"owner points at the question", withRecords(t, record(pointer(12), dns.TypeA, a)), true},
		{"owner points at a later label of the question", withRecords(t, record(cat(label(3), pointer(16)), dns.TypeA, a)), true},
		{"owner points at itself", withRecords(t, record(pointer(namesQEnd), dns.TypeA, a)), false},
		{"owner points past the message", withRecords(t, record(pointer(namesQEnd+400), dns.TypeA, a)), false},
		{"owner points forward at a sound name", withRecords(t, record(pointer(namesQEnd+16), dns.TypeA, a), record(cat(label(1), []byte{0}), dns.TypeA, a)), false},
		{"owner points into the header", withRecords(t, record(pointer(4), dns.TypeA, a)), false},
		{"owner points into the middle of a label", withRecords(t, record(pointer(17), dns.TypeA, a)), false},
		{"owner points at the root of the question", withRecords(t, record(pointer(28), dns.TypeA, a)), false},
		{"owner points into an earlier TTL", withRecords(t, record(pointer(12), dns.TypeA, a), record(pointer(namesQEnd+2+4), dns.TypeA, a)), false},
		{"owner points at an earlier owner", withRecords(t, record(cat(label(1), pointer(12)), dns.TypeA, a), record(pointer(namesQEnd), dns.TypeA, a)), true},
		{"reserved label type in a CNAME target", withRecords(t, record(pointer(12), dns.TypeCNAME, []byte{0x40, 'x', 0})), false},
		{"255 octets through a pointer", withRecords(t, record(long, dns.TypeA, a), record(cat(label(45), pointer(namesQEnd)), dns.TypeA, a)), true},
		{"256 octets through a pointer", withRecords(t, record(long, dns.TypeA, a), record(cat(label(46), pointer(namesQEnd)), dns.TypeA, a)), false},
		{"126 pointers", chain(t, 125), true},
		{"127 pointers", chain(t, 126), false},
		{"A of 5 bytes", withRecords(t, record(pointer(12), dns.TypeA, append(a, 0))), false},
		{"AAAA of 4 bytes", withRecords(t, record(pointer(12), dns.TypeAAAA, a)), false},
		{"CNAME target points at itself", withRecords(t, record(pointer(12), dns.TypeCNAME, pointer(namesQEnd+12))), false},
		{"CNAME target points at the owner", withRecords(t, record(cat(label(2), pointer(12)), dns.TypeCNAME, cat(label(1), pointer(namesQEnd)))), true},
		{"CNAME with a byte after its target", withRecords(t, record(pointer(12), dns.TypeCNAME, cat(pointer(16), []byte{0}))), false},
		{"CNAME target runs past its RDATA", withRecords(t, record(pointer(12), dns.TypeCNAME, label(3))), false},
		{"CNAME of no RDATA", withRecords(t, record(pointer(12), dns.TypeCNAME, nil)), false},
		{"NS target, then glue pointing at it", withRecords(t, record(pointer(16), dns.TypeNS, cat(label(2), pointer(16))),
			record(pointer(namesQEnd+2+10), dns.TypeA, a)), true},
		{"MX", withRecords(t, record(pointer(12), dns.TypeMX, cat([]byte{0, 10}, pointer(16)))), true},
		{"MX without its preference", withRecords(t, record(pointer(12), dns.TypeMX, []byte{0})), false},
		{"SOA", withRecords(t, record(pointer(16), dns.TypeSOA, soa)), true},
		{"SOA one number short", withRecords(t, record(pointer(16), dns.TypeSOA, soa[:len(soa)-4])), false},
		{"SOA RNAME points at itself", withRecords(t, record(pointer(16), dns.TypeSOA, cat(pointer(16), pointer(namesQEnd+14), make([]byte, 20)))), false},
		{"SRV target points past the message", withRecords(t, record(pointer(12), dns.TypeSRV, cat(make([]byte, 6), pointer(1000)))), false},
		{"RRSIG signer written out", withRecords(t, record(pointer(12), dns.TypeRRSIG, cat(make([]byte, 18), label(3), []byte{0}, []byte{1, 2, 3}))), true},
		{"RRSIG signer compressed", withRecords(t, record(pointer(12), dns.TypeRRSIG, cat(make([]byte, 18), pointer(16), []byte{1, 2, 3}))), false},
		{"DNAME target compressed", withRecords(t, record(pointer(12), dns.TypeDNAME, pointer(16))), false},
		{"unknown type: RDATA not read", withRecords(t, record(pointer(12), 65280, pointer(0))), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			qend, ok := QuestionEnd(tt.msg)
			if !ok || qend != namesQEnd {
				t.Fatalf("question ends at %d, %v", qend, ok)
			}
			s, ok := ReadSections(tt.msg, qend)
			if !ok {
				t.Fatal("the records do not walk")
			}
			if got := NamesReadable(tt.msg, qend, s.AN); got != tt.ok {
				t.Fatalf("NamesReadable = %v, want %v", got, tt.ok)
			}
			if err := new(dns.Msg).Unpack(tt.msg); tt.ok && err != nil {
				t.Fatalf("accepted, but miekg/dns cannot read it: %v", err)
			}
		})
	}
}

// TestNamesReadableTakesCompressedAnswers: answers of every type that
// holds a name, compressed by miekg/dns, are readable: the check refuses
// no answer a compressor writes.
func TestNamesReadableTakesCompressedAnswers(t *testing.T) {
	rrs := []string{
		"www.example.com. 60 IN CNAME host.example.com.",
		"host.example.com. 60 IN A 192.0.2.1",
		"host.example.com. 60 IN AAAA 2001:db8::1",
		"example.com. 60 IN NS ns1.example.com.",
		"example.com. 60 IN MX 10 mail.example.com.",
		"example.com. 60 IN SOA ns1.example.com. hostmaster.example.com. 1 2 3 4 5",
		"1.2.0.192.in-addr.arpa. 60 IN PTR host.example.com.",
		"_sip._udp.example.com. 60 IN SRV 0 5 5060 sip.example.com.",
		"example.com. 60 IN NAPTR 100 10 \"S\" \"SIP+D2U\" \"\" _sip._udp.example.com.",
		"example.com. 60 IN RP mbox.example.com. txt.example.com.",
		"example.com. 60 IN AFSDB 1 afs.example.com.",
		"example.com. 60 IN MINFO r.example.com. e.example.com.",
		"example.com. 60 IN RT 10 relay.example.com.",
		"example.com. 60 IN PX 10 map.example.com. mapx.example.com.",
		"example.com. 60 IN KX 10 kx.example.com.",
		"example.com. 60 IN TXT \"v=spf1 -all\"",
		"sub.example.com. 60 IN DNAME other.example.com.",
		"example.com. 60 IN HTTPS 1 svc.example.com. alpn=h2",
		"example.com. 60 IN RRSIG A 8 2 60 20261231000000 20261201000000 12345 example.com. AAECAw==",
		"example.com. 60 IN NSEC www.example.com. A NS SOA RRSIG NSEC",
		"example.com. 60 IN DS 12345 8 2 0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF",
	}
	m := new(dns.Msg).SetQuestion("www.example.com.", dns.TypeA)
	m.Response, m.Compress = true, true
	for _, s := range rrs {
		rr, err := dns.NewRR(s)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		m.Answer = append(m.Answer, rr)
	}
	m.Ns = m.Answer[:3]
	m.Extra = m.Answer[3:]
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b[HeaderLen+17:], pointer(HeaderLen+4)) {
		t.Fatal("the message holds no pointer at example.com.: not compressed")
	}
	qend, _ := QuestionEnd(b)
	if !NamesReadable(b, qend, 2*len(rrs)) {
		t.Fatal("a compressed answer is refused")
	}
}

// FuzzNamesReadable: whatever NamesReadable accepts, miekg/dns reads, for
// the types whose RDATA it reads whole; and a message it accepts written
// out, miekg/dns's packing of it with compression is accepted too.
func FuzzNamesReadable(f *testing.F) {
	f.Add(withRecords(f, record(pointer(12), dns.TypeCNAME, pointer(namesQEnd+12))))
	f.Add(withRecords(f, record(pointer(16), dns.TypeSOA, cat(pointer(16), label(3), pointer(16), make([]byte, 20)))))
	f.Add(withRecords(f, record(cat(label(2), pointer(12)), dns.TypeMX, cat([]byte{0, 1}, pointer(namesQEnd)))))
	f.Add(withRecords(f, record(pointer(namesQEnd+400), dns.TypeA, []byte{1, 2, 3, 4})))
	f.Add(chain(f, 126))
	whole := map[uint16]bool{dns.TypeA: true, dns.TypeAAAA: true, dns.TypeNS: true, dns.TypeMD: true, dns.TypeMF: true,
		dns.TypeCNAME: true, dns.TypeSOA: true, dns.TypeMB: true, dns.TypeMG: true, dns.TypeMR: true, dns.TypePTR: true,
		dns.TypeMINFO: true, dns.TypeMX: true, dns.TypeRP: true, dns.TypeAFSDB: true, dns.TypeRT: true, dns.TypePX: true,
		dns.TypeSRV: true, dns.TypeNAPTR: true, dns.TypeKX: true, dns.TypeDNAME: true, dns.TypeTALINK: true, dns.TypeLP: true}
	f.Fuzz(func(t *testing.T, msg []byte) {
		qend, ok := QuestionEnd(msg)
		if !ok {
			return
		}
		if qd, _, _, _ := Counts(msg); qd != 1 {
			return
		}
		s, ok := ReadSections(msg, qend)
		if !ok {
			return
		}
		n := s.AN + s.NS + s.AR
		if s.OPT.Present {
			n++
		}
		if NamesReadable(msg, qend, n) {
			for off, i := qend, 0; i < n; i++ {
				end, _ := skipName(msg, off)
				typ := binary.BigEndian.Uint16(msg[end:])
				_, known := dns.TypeToRR[typ]
				if whole[typ] || !known && typ != TypeOPT {
					if _, next, err := dns.UnpackRR(msg, off); err != nil || next != end+10+int(binary.BigEndian.Uint16(msg[end+8:])) {
						t.Fatalf("record %d (type %d) accepted, but miekg/dns reads it so: %v", i, typ, err)
					}
				}
				off = end + 10 + int(binary.BigEndian.Uint16(msg[end+8:]))
			}
		}
		var m dns.Msg
		if m.Unpack(msg[:s.End]) != nil || len(m.Question) != 1 {
			return
		}
		for _, rr := range append(append(append([]dns.RR(nil), m.Answer...), m.Ns...), m.Extra...) {
			if rr.Header().Rdlength == 0 || !whole[rr.Header().Rrtype] {
				return
			}
		}
		n = len(m.Answer) + len(m.Ns) + len(m.Extra)
		plain, err := m.Pack() // miekg/dns packs what it read loosely (an SRV cut short) as it read it
		if err != nil || !NamesReadable(plain, qend, n) {
			return
		}
		m.Compress = true
		b, err := m.Pack()
		if err != nil {
			return
		}
		if qend, ok := QuestionEnd(b); !ok || !NamesReadable(b, qend, n) {
			t.Fatalf("%x is accepted, compressed by miekg/dns as %x refused", plain, b)
		}
	})
}

// BenchmarkNamesReadable is the check Store adds to a miss: a typical
// answer (CNAME, A, two NS, their glue, compressed), and the longest a
// name's pointers can make it, 128 records chained by 126 pointers.
func BenchmarkNamesReadable(b *testing.B) {
	m := new(dns.Msg).SetQuestion("www.example.com.", dns.TypeA)
	m.Response, m.Compress = true, true
	for _, s := range []string{"www.example.com. 60 IN CNAME host.example.com.", "host.example.com. 60 IN A 192.0.2.1",
		"example.com. 60 IN NS ns1.example.com.", "example.com. 60 IN NS ns2.example.com.",
		"ns1.example.com. 60 IN A 192.0.2.53", "ns2.example.com. 60 IN A 192.0.2.54"} {
		rr, err := dns.NewRR(s)
		if err != nil {
			b.Fatal(err)
		}
		m.Answer = append(m.Answer, rr)
	}
	typical, err := m.Pack()
	if err != nil {
		b.Fatal(err)
	}
	for _, bm := range []struct {
		name string
		msg  []byte
		n    int
	}{{"typical", typical, 6}, {"126-pointers", chain(b, 125), 127}} {
		b.Run(bm.name, func(b *testing.B) {
			qend, _ := QuestionEnd(bm.msg)
			if !NamesReadable(bm.msg, qend, bm.n) {
				b.Fatal("refused")
			}
			b.ReportAllocs()
			for b.Loop() {
				NamesReadable(bm.msg, qend, bm.n)
			}
		})
	}
}
