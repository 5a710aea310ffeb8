package main

import (
	"testing"
	"time"

	"github.com/miekg/dns"
)

// Tests from an adversarial review of the day's changes (TestDiff...).

// A reply whose answer record's owner name is a compression pointer
// forward, into the owner name of the TSIG record that ends the message
// (RFC 1035 §4.1.4 does not forbid a forward pointer; miekg/dns reads one).
// The reply reads whole. The proxy now leaves the TSIG behind
// (wire.Sections.Relayed) but relays the answer record as it is, pointer
// and all: the client gets a pointer past the end of its message.
func TestDiffDroppedTSIGLeavesNoPointerDangling(t *testing.T) {
	a, up, _ := startCaching(t, nil)
	readable := make(chan bool, 4)
	up.SetScript(func(req *dns.Msg, _ string) [][]byte {
		name := req.Question[0].Name
		m := answerFor(req)
		m.Extra = append(m.Extra, &dns.TSIG{Hdr: dns.RR_Header{Name: name, Rrtype: dns.TypeTSIG, Class: dns.ClassANY},
			Algorithm: dns.HmacSHA256, TimeSigned: uint64(time.Now().Unix()), Fudge: 300,
			MACSize: 1, MAC: "ab", OrigId: req.Id})
		m.Compress = false
		pkt, err := m.Pack()
		if err != nil {
			t.Errorf("packing: %v", err)
			return nil
		}
		l := len(name) + 1 // the name's wire length, uncompressed
		qend := 12 + l + 4
		rest := pkt[qend+l : qend+l+14] // the A record after its owner
		tsigAt := qend + 2 + len(rest)
		out := append([]byte(nil), pkt[:qend]...)
		out = append(out, 0xC0|byte(tsigAt>>8), byte(tsigAt))
		out = append(out, rest...)
		out = append(out, pkt[qend+l+14:]...)
		var check dns.Msg
		uerr := check.Unpack(out)
		if uerr != nil {
			t.Logf("crafted: %v", uerr)
		}
		readable <- uerr == nil && len(check.Answer) == 1
		return [][]byte{out}
	})
	pkt, err := query("www.example.com", dns.TypeA).Pack()
	if err != nil {
		t.Fatal(err)
	}
	b := sendRaw(t, a.addr(), pkt, 2*time.Second)
	select {
	case ok := <-readable:
		if !ok {
			t.Fatal("the crafted reply does not read: the test is wrong")
		}
	default:
		t.Fatal("the upstream was not asked")
	}
	var r dns.Msg
	if b == nil {
		t.Fatal("no answer")
	}
	if err := r.Unpack(b); err != nil {
		t.Fatalf("the upstream's reply read whole; the client's answer does not: %v (%x)", err, b)
	}
}
