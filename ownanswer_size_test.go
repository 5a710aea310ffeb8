package main

import (
	"testing"

	"github.com/miekg/dns"
)

// A spoofed UDP query the proxy answers itself, past both gates (off by
// default), is reflected to the forged source: its answer must be no larger
// than the query, as the README asks of slip's TC answers ("a spoofed flood
// gets nothing to amplify"). EDEs once put on FORMERR, NOTIMP, BADVERS and
// the transfer's REFUSED made each of these answers 21 to 36 bytes larger
// than the smallest query that draws it (up to 2.29×), with no bucket
// bounding them (the denied answers' bucket covers only clients outside
// DNS_ALLOW); they carry none now.
func TestOwnErrorAnswersDoNotAmplify(t *testing.T) {
	opt := []byte{0, 0, 41, 0x10, 0, 0, 0, 0, 0, 0, 0} // root, OPT, 4096, rcode 0, version 0, DO clear, no options
	optV1 := []byte{0, 0, 41, 0x10, 0, 0, 1, 0, 0, 0, 0}
	header := func(opcode, qd int) []byte {
		return []byte{0x12, 0x34, byte(opcode<<3) | 1, 0, 0, byte(qd), 0, 0, 0, 0, 0, 1}
	}
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	tests := []struct {
		name  string
		pkt   []byte
		rcode int
	}{
		{"FORMERR, no question", cat(header(0, 0), opt), dns.RcodeFormatError},
		{"NOTIMP, NOTIFY without a question", cat(header(dns.OpcodeNotify, 0), opt), dns.RcodeNotImplemented},
		{"REFUSED, AXFR of the root", cat(header(0, 1), []byte{0, 0, 252, 0, 1}, opt), dns.RcodeRefused},
		{"BADVERS, version 1", cat(header(0, 1), []byte{0, 0, 1, 0, 1}, optV1), dns.RcodeBadVers},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, srv := unitProxy(nil, &scripted{reply: zone(nil)})
			r, raw := servePkt(t, srv, tt.pkt)
			if r == nil {
				t.Fatal("no answer")
			}
			if r.Rcode != tt.rcode {
				t.Fatalf("answered %s, want %s", rcodeName(r), dns.RcodeToString[tt.rcode])
			}
			if len(raw) > len(tt.pkt) {
				t.Fatalf("a %d-byte query drew a %d-byte answer (%.2f×), with no bucket to bound it: a spoofed flood is amplified", len(tt.pkt), len(raw), float64(len(raw))/float64(len(tt.pkt)))
			}
		})
	}
}
