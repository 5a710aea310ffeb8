package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// These tests come from an adversarial review of what the proxy does with a
// client that sends legal but unusual DNS, held to the RFCs a forwarder must
// honour and to the README's "What the proxy promises".

// bigTXTReply is the upstream's answer to req with TXT records that bring
// it to exactly size bytes, names uncompressed, and no OPT record even if
// req had one: an upstream that does not speak EDNS may answer so (RFC
// 6891 §7: a responder without EDNS ignores the OPT record).
func bigTXTReply(t *testing.T, req *dns.Msg, size int) []byte {
	m := new(dns.Msg)
	m.SetReply(req)
	m.Compress = false
	m.Extra = nil
	hdr := dns.RR_Header{Name: req.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 60}
	long := strings.Repeat("x", 255)
	for m.Len() < size-600 {
		m.Answer = append(m.Answer, &dns.TXT{Hdr: hdr, Txt: []string{long}})
	}
	// One more record of the length that lands exactly on size: its owner,
	// type, class, TTL and RDLENGTH, then character-strings of up to 255.
	rest := size - m.Len() - (len(req.Question[0].Name) + 1 + 10)
	var txt []string
	for rest > 0 {
		n := min(rest-1, 255)
		txt = append(txt, strings.Repeat("y", n))
		rest -= n + 1
	}
	m.Answer = append(m.Answer, &dns.TXT{Hdr: hdr, Txt: txt})
	b, err := m.Pack()
	if err != nil || len(b) != size {
		t.Errorf("building a %d-byte reply: %d bytes, %v", size, len(b), err)
		return nil
	}
	return b
}

// RFC 1035 §4.2.2: a TCP message is at most 65,535 bytes. The proxy builds
// its answer from the upstream's records and its own OPT record for a
// client that sent one (RFC 6891 §6.1.1). An upstream that does not speak
// EDNS answers the proxy's OPT-carrying query without an OPT; when its TCP
// answer is within 11 bytes of the limit, the proxy's answer (the same
// records plus an 11-byte OPT) would pass 65,535 bytes, which the TCP
// writer refuses (dns.ErrBuf): the client would get nothing while the
// query is counted forwarded. The review expected that silence; it does
// not happen, because appendFor holds a TCP answer to 65,535 bytes too and
// sends TC with empty sections instead. This guards that no answer too
// large for TCP is ever lost in silence.
func TestProtoTCPAnswerNearSixtyFourKiBIsNeverSilent(t *testing.T) {
	up := startUpstream(t)
	up.SetScript(func(req *dns.Msg, network string) [][]byte {
		if network != "tcp" || len(req.Question) != 1 {
			return nil
		}
		if b := bigTXTReply(t, req, dns.MaxMsgSize-4); b != nil {
			return [][]byte{b}
		}
		return nil
	})
	a := startProxy(t, testConfig(up.Addr()), nil)
	m := ednsQuery("big.example.com", dns.TypeTXT, 1232, false)
	r, err := tryAsk("tcp", a.addr(), m, 2*time.Second)
	if err != nil {
		t.Fatalf("TCP client with EDNS, upstream's answer 65,531 bytes without OPT: no answer (%v); counted forwarded %d",
			err, count(a, "TXT", "forwarded", 1))
	}
	if r.Id != m.Id || r.IsEdns0() == nil || !r.Truncated && len(r.Answer) == 0 {
		t.Fatalf("answer %v: want the client's ID, an OPT record, and the records or TC", r)
	}
}

// signatures are the two transaction signatures a message may end with,
// each for the message given (a TSIG carries its original ID), with a MAC
// or signature no key made: TSIG first.
var signatures = []struct {
	name string
	rr   func(m *dns.Msg) dns.RR
}{
	{"TSIG", func(m *dns.Msg) dns.RR {
		return &dns.TSIG{Hdr: dns.RR_Header{Name: "key.", Rrtype: dns.TypeTSIG, Class: dns.ClassANY},
			Algorithm: dns.HmacSHA256, TimeSigned: uint64(time.Now().Unix()), Fudge: 300,
			MACSize: 32, MAC: strings.Repeat("ab", 32), OrigId: m.Id}
	}},
	{"SIG(0)", func(*dns.Msg) dns.RR {
		return &dns.SIG{RRSIG: dns.RRSIG{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeSIG, Class: dns.ClassANY},
			Algorithm: dns.ECDSAP256SHA256, Expiration: uint32(time.Now().Add(time.Hour).Unix()),
			Inception: uint32(time.Now().Unix()), KeyTag: 1, SignerName: "example.com.",
			Signature: strings.Repeat("QUFB", 16)}}
	}},
}

// The comment on readUpstreamAnswer promises that a TSIG or SIG(0) record,
// which signs the upstream's hop and which the client cannot verify, is
// left behind. It is, only when the upstream's reply carries an OPT record
// before it: to a client without EDNS (so no OPT upstream either) such a
// record is relayed, and the cache stores it and replays it to every later
// client of the name. TSIG is a meta-RR, which lives in one message and is
// never cached (RFC 6895 §3.1), signing one hop's transaction (RFC 8945);
// a client that did not sign gets a signature it cannot verify (miekg/dns's
// client fails such an exchange with "no secrets defined"). With EDNS the
// same reply reaches the client without it: only the OPT's position decides.
func TestProtoUpstreamSignatureNeverReachesAClient(t *testing.T) {
	for _, sig := range signatures {
		t.Run(sig.name, func(t *testing.T) {
			a, up, _ := startCaching(t, nil)
			up.SetScript(func(req *dns.Msg, _ string) [][]byte {
				m := answerFor(req)
				m.Extra = append(m.Extra, sig.rr(req))
				b, err := m.Pack()
				if err != nil {
					t.Errorf("packing the signed reply: %v", err)
					return nil
				}
				return [][]byte{b}
			})
			for _, round := range []string{"forwarded", "from the cache"} {
				pkt, err := query("www.example.com", dns.TypeA).Pack()
				if err != nil {
					t.Fatal(err)
				}
				b := sendRaw(t, a.addr(), pkt, 2*time.Second)
				r := new(dns.Msg)
				if b == nil || r.Unpack(b) != nil {
					t.Fatalf("%s: no readable answer (%x)", round, b)
				}
				if len(r.Extra) != 0 {
					t.Errorf("%s to a client without EDNS (upstream asked %d times): the upstream's %s reached it (a %s record)",
						round, up.Total(), sig.name, dns.TypeToString[r.Extra[0].Header().Rrtype])
				}
			}
		})
	}
}

// A client's TSIG or SIG(0) signs its hop to the proxy with a key the
// proxy does not hold, and the proxy rewrites what it sends upstream (the
// ID, the name's case, the OPT): the signature cannot be passed on, and a
// forwarder must not change a signed message (RFC 8945 §5.5). Dropped, as
// it once was, the query went upstream unsigned and the client got an
// unsigned answer, from the upstream's view for unsigned queries, which a
// client library that does not insist on a signature took silently. Now
// it is NOTIMP at once, question echoed, and nothing is sent upstream.
func TestProtoSignedQueryIsRefusedNotForwardedUnsigned(t *testing.T) {
	for _, sig := range signatures {
		for _, edns := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/edns=%v", sig.name, edns), func(t *testing.T) {
				up := startUpstream(t)
				a := startProxy(t, testConfig(up.Addr()), nil)
				q := query("www.example.com", dns.TypeA)
				if edns {
					q.SetEdns0(1232, false)
				}
				q.Extra = append(q.Extra, sig.rr(q))
				pkt, err := q.Pack()
				if err != nil {
					t.Fatal(err)
				}
				b := sendRaw(t, a.addr(), pkt, 2*time.Second)
				r := new(dns.Msg)
				if b == nil || r.Unpack(b) != nil {
					t.Fatalf("no readable answer (%x)", b)
				}
				if r.Rcode != dns.RcodeNotImplemented || r.Id != q.Id || len(r.Question) != 1 || r.Question[0].Name != "www.example.com." {
					t.Errorf("answered %s (ID %d, question %v), want NOTIMP for ID %d with its question; the upstream was asked %d times",
						dns.RcodeToString[r.Rcode], r.Id, r.Question, q.Id, up.Total())
				}
				if up.Total() != 0 {
					t.Errorf("the upstream was asked %d times for a signed query, without its signature", up.Total())
				}
				if got := r.IsEdns0() != nil; got != edns {
					t.Errorf("OPT in the answer: %v, want %v (as the query)", got, edns)
				}
			})
		}
	}
}

// A transaction signature must be the last record of a message (RFC 8945
// §5.1: FORMERR otherwise), so a query with one before its OPT, or with
// two, is malformed, not a signed query the proxy does not implement; and
// it is never forwarded with its signature dropped, as one before the OPT
// was while only a last record counted as a signature.
func TestProtoMisplacedSignatureIsFormErr(t *testing.T) {
	tsig := signatures[0].rr
	opt := func() dns.RR {
		o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		o.SetUDPSize(1232)
		return o
	}
	for _, tt := range []struct {
		name  string
		extra func(q *dns.Msg) []dns.RR
	}{
		{"TSIG before the OPT", func(q *dns.Msg) []dns.RR { return []dns.RR{tsig(q), opt()} }},
		{"two TSIGs", func(q *dns.Msg) []dns.RR { return []dns.RR{tsig(q), tsig(q)} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			up := startUpstream(t)
			a := startProxy(t, testConfig(up.Addr()), nil)
			q := query("www.example.com", dns.TypeA)
			q.Extra = tt.extra(q)
			pkt, err := q.Pack()
			if err != nil {
				t.Fatal(err)
			}
			b := sendRaw(t, a.addr(), pkt, 2*time.Second)
			if len(b) < 12 {
				t.Fatalf("no answer (%x)", b)
			}
			if rcode := int(b[3] & 0xF); rcode != dns.RcodeFormatError || up.Total() != 0 {
				t.Errorf("answered %s, the upstream asked %d times; want FORMERR and nothing sent", dns.RcodeToString[rcode], up.Total())
			}
		})
	}
}

// RFC 7766 §6.2.1 lets a client send its queries and close its side
// (half-close); the server still owes it the answers. The proxy's reader
// sees EOF, waits for what is due, then closes gracefully (endConn,
// linger). Three pipelined queries, one of them split over two writes with
// a pause, then the write side shut: all three answered, each with its own
// ID, then a FIN.
func TestProtoTCPHalfCloseStillGetsItsAnswers(t *testing.T) {
	up := startUpstream(t)
	a := startProxy(t, testConfig(up.Addr()), nil)
	c, err := net.DialTimeout("tcp", a.addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	var stream []byte
	for i, name := range []string{"a.example.com", "b.example.com", "c.example.com"} {
		m := query(name, dns.TypeA)
		m.Id = uint16(0x100 + i)
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		stream = binary.BigEndian.AppendUint16(stream, uint16(len(b)))
		stream = append(stream, b...)
	}
	cut := len(stream) - 7 // inside the last query
	if _, err := c.Write(stream[:cut]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // a pause between two segments of one query, not a wait for an event
	if _, err := c.Write(stream[cut:]); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	seen := map[uint16]bool{}
	for range 3 {
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			t.Fatalf("after half-close, %d answers of 3, then: %v", len(seen), err)
		}
		b := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatal(err)
		}
		r := new(dns.Msg)
		if err := r.Unpack(b); err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			t.Fatalf("answer %v (%v)", r, err)
		}
		seen[r.Id] = true
	}
	if len(seen) != 3 {
		t.Fatalf("IDs answered %v, want 0x100, 0x101, 0x102", seen)
	}
	if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("after the last answer: %d bytes, %v; want EOF (the proxy's FIN)", n, err)
	}
}

// protoQuery is a query with one question (name in wire form, qtype, class
// IN) and the given header flags.
func protoQuery(id, flags uint16, name []byte, qtype uint16) []byte {
	b := make([]byte, 12, 12+len(name)+4)
	binary.BigEndian.PutUint16(b, id)
	binary.BigEndian.PutUint16(b[2:], flags)
	binary.BigEndian.PutUint16(b[4:], 1)
	b = append(b, name...)
	b = binary.BigEndian.AppendUint16(b, qtype)
	return binary.BigEndian.AppendUint16(b, dns.ClassINET)
}

// Legal but unusual headers and names, over the wire. Opcodes IQUERY,
// STATUS and UPDATE get NOTIMP (counted notimp), the opcode echoed; TC, Z
// or an RCODE set on a query change nothing (forwarded); a name whose
// labels hold a zero byte, a dot, a space and a byte above 0x7F with its
// 0x20 bit clear (0xC1, which 0x20 randomisation must leave alone) comes
// back byte for byte, upper-case letters included. These passed: they
// guard the README's "its question back byte for byte" and "an opcode
// other than QUERY gets NOTIMP".
func TestProtoUnusualHeadersAndNames(t *testing.T) {
	up := startUpstream(t)
	a := startProxy(t, testConfig(up.Addr()), nil)
	www := []byte{3, 'w', 'W', 'w', 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 0}
	oddName := []byte{5, 0xC1, 0x00, '.', ' ', 'Q', 7, 'E', 'x', 'A', 'm', 'P', 'l', 'E', 0}
	tests := []struct {
		name    string
		pkt     []byte
		rcode   int
		outcome string
	}{
		{"IQUERY", protoQuery(1, wire.FlagRD|1<<11, www, dns.TypeA), dns.RcodeNotImplemented, "notimp"},
		{"STATUS", protoQuery(2, wire.FlagRD|2<<11, www, dns.TypeA), dns.RcodeNotImplemented, "notimp"},
		{"UPDATE", protoQuery(3, 5<<11, www, dns.TypeSOA), dns.RcodeNotImplemented, "notimp"},
		{"TC set", protoQuery(4, wire.FlagRD|wire.FlagTC, www, dns.TypeA), dns.RcodeSuccess, "forwarded"},
		{"Z set", protoQuery(5, wire.FlagRD|0x40, www, dns.TypeA), dns.RcodeSuccess, "forwarded"},
		{"RCODE set", protoQuery(6, wire.FlagRD|dns.RcodeRefused, www, dns.TypeA), dns.RcodeSuccess, "forwarded"},
		{"binary name", protoQuery(7, wire.FlagRD, oddName, dns.TypeA), dns.RcodeSuccess, "forwarded"},
	}
	counts := map[string]int{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := sendRaw(t, a.addr(), tt.pkt, 2*time.Second)
			if len(b) < len(tt.pkt) {
				t.Fatalf("answer %x", b)
			}
			qend := len(tt.pkt)
			if wire.ID(b) != wire.ID(tt.pkt) || string(b[12:qend]) != string(tt.pkt[12:qend]) {
				t.Fatalf("answer %x: want ID and question of %x byte for byte", b[:qend], tt.pkt)
			}
			flags := wire.Flags(b)
			if int(flags&0xF) != tt.rcode || wire.Opcode(b) != wire.Opcode(tt.pkt) || flags&wire.FlagQR == 0 {
				t.Fatalf("flags %#04x: want QR, opcode %d, rcode %d", flags, wire.Opcode(tt.pkt), tt.rcode)
			}
			qtype := "A"
			if wire.QType(tt.pkt, qend) == dns.TypeSOA {
				qtype = "SOA"
			}
			counts[qtype+" "+tt.outcome]++
			if got := count(a, qtype, tt.outcome, counts[qtype+" "+tt.outcome]); got != counts[qtype+" "+tt.outcome] {
				t.Fatalf("%s %s counted %d, want %d", qtype, tt.outcome, got, counts[qtype+" "+tt.outcome])
			}
		})
	}
}
