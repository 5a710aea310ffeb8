package main

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// oneRecord answers every query NOERROR with one answer record that
// record(qend) builds, qend being where the question ends in the reply:
// a header and question echoed from the query, sound framing, and record's
// bytes as they are.
func oneRecord(record func(qend int) []byte) func(req *dns.Msg, _ string) [][]byte {
	return func(req *dns.Msg, _ string) [][]byte {
		m := new(dns.Msg)
		m.SetReply(req)
		m.RecursionAvailable = true
		b, err := m.Pack()
		if err != nil {
			return nil
		}
		qend, ok := wire.QuestionEnd(b)
		if !ok {
			return nil
		}
		b = append(b[:qend], record(qend)...)
		wire.SetCounts(b, 1, 1, 0, 0)
		return [][]byte{b}
	}
}

// rr is a record of type typ, TTL 60, owned by the name owner (wire form,
// pointers allowed), with rdata.
func rr(owner []byte, typ uint16, rdata []byte) []byte {
	b := append([]byte(nil), owner...)
	b = binary.BigEndian.AppendUint16(b, typ)
	b = binary.BigEndian.AppendUint16(b, dns.ClassINET)
	b = binary.BigEndian.AppendUint32(b, 60)
	b = binary.BigEndian.AppendUint16(b, uint16(len(rdata)))
	return append(b, rdata...)
}

// ptr is a compression pointer to off.
func ptr(off int) []byte { return binary.BigEndian.AppendUint16(nil, 0xC000|uint16(off)) }

// The README: the cache never stores "an answer that does not parse", and
// an upstream that answers with garbage "costs only the query it hit". A
// reply whose names are compression loops, or point past the message,
// walks (wire.ReadSections follows no pointer and reads no RDATA) but
// parses nowhere: every client of the name gets bytes it cannot read. Asked
// twice, such an answer must go upstream twice; stored, it is handed to
// every client of the name for its TTL and the upstream is not asked again.
func TestAttackAnswerThatDoesNotParseIsNotCached(t *testing.T) {
	a4 := []byte{192, 0, 2, 1}
	tests := []struct {
		name   string
		record func(qend int) []byte
	}{
		{"owner points at itself", func(qend int) []byte { return rr(ptr(qend), dns.TypeA, a4) }},
		{"owner points past the message", func(qend int) []byte { return rr(ptr(qend+400), dns.TypeA, a4) }},
		{"CNAME target points at itself", func(qend int) []byte {
			return rr(ptr(wire.HeaderLen), dns.TypeCNAME, ptr(qend+12)) // 2 bytes of owner, 10 of fixed fields
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, up, _ := startCaching(t, nil)
			up.SetScript(oneRecord(tt.record))
			pkt, _ := query("bad.example.com", dns.TypeA).Pack()
			for i := range 2 {
				raw := sendRaw(t, a.addr(), pkt, 2*time.Second)
				if raw == nil {
					t.Fatalf("query %d: no answer", i)
				}
				var m dns.Msg
				if err := m.Unpack(raw); err != nil {
					t.Logf("query %d: the client cannot read its answer: %v", i, err)
				}
			}
			if udp, _ := up.Received(); udp != 2 {
				t.Errorf("the upstream received %d UDP queries, want 2: an answer that does not parse was stored and served from the cache", udp)
			}
			if n := metric(t, a, "dnsproxi_cache_entries"); n != 0 {
				t.Errorf("cache_entries %v, want 0", n)
			}
		})
	}
}
