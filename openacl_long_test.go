package main

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// open names the families a list covers whole, however it is written, and
// nothing else: gaps of one address, overlaps, nesting, mapped forms.
func TestAccessRuleOpen(t *testing.T) {
	tests := []struct{ allow, want string }{
		{"0.0.0.0/0", "IPv4"},
		{"::/0", "IPv6"},
		{"0.0.0.0/0,::/0", "IPv4 and IPv6"},
		{"::ffff:0.0.0.0/96", "IPv4"},
		{"0.0.0.0/1,128.0.0.0/1", "IPv4"},
		{"128.0.0.0/1,0.0.0.0/2,64.0.0.0/2,10.0.0.0/8", "IPv4"}, // unordered, nested
		{"0.0.0.0/1,128.0.0.0/2,192.0.0.0/3,224.0.0.0/3", "IPv4"},
		{"0.0.0.0/1,128.0.0.0/2,192.0.0.0/3,224.0.0.0/4", ""},                        // 240.0.0.0/4 left out
		{"0.0.0.0/1,128.0.0.0/1,::/1,8000::/2,c000::/2", "IPv4 and IPv6"},            // both, in pieces
		{"::/1,8000::/2,c000::/3,e000::/3", "IPv6"},                                  //
		{"::/1,8000::/1,0.0.0.0/1", "IPv6"},                                          // IPv4 half only
		{"0.0.0.0/1,128.0.0.0/2,192.0.0.0/2,255.255.255.255/32", "IPv4"},             // overlap at the top
		{"0.0.0.0/1,128.0.0.0/2,192.0.0.0/3,224.0.0.0/3,255.255.255.254/31", "IPv4"}, //
		{"1.0.0.0/8,0.0.0.0/8,2.0.0.0/7", ""},
		{"local", ""},
		{"any", "IPv4 and IPv6"},
	}
	for _, tt := range tests {
		var r AccessRule
		if err := r.Decode(tt.allow); err != nil {
			t.Fatalf("%s: %v", tt.allow, err)
		}
		if got := r.open(); got != tt.want {
			t.Errorf("DNS_ALLOW=%s: open %q, want %q", tt.allow, got, tt.want)
		}
	}
	// Every IPv4 address but one, in 32 prefixes: not open.
	var parts []string
	gap := netip.MustParseAddr("203.0.113.7").As4()
	for bits := 1; bits <= 32; bits++ {
		var b [4]byte
		for i := range bits {
			bit := gap[i/8] >> (7 - i%8) & 1
			if i == bits-1 {
				bit ^= 1 // the half the gap is not in
			}
			b[i/8] |= bit << (7 - i%8)
		}
		parts = append(parts, netip.PrefixFrom(netip.AddrFrom4(b), bits).String())
	}
	var r AccessRule
	if err := r.Decode(strings.Join(parts, ",")); err != nil {
		t.Fatal(err)
	}
	if got := r.open(); got != "" {
		t.Fatalf("every IPv4 address but 203.0.113.7: open %q, want none", got)
	}
	if err := r.Decode(strings.Join(append(parts, "203.0.113.7"), ",")); err != nil {
		t.Fatal(err)
	}
	if got := r.open(); got != "IPv4" {
		t.Fatalf("every IPv4 address in 33 prefixes: open %q, want IPv4", got)
	}
}

// longAllow is a DNS_ALLOW of n host addresses, ::0 onwards: about as many
// as one environment string holds at n = 16,384 (110 KB).
func longAllow(n int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf("::%x", i)
	}
	return strings.Join(items, ",")
}

// A list of 16,384 host addresses covers no family. (From a no-context
// review: the check walked the prefixes' tree node by node, scanning the
// whole list at each, 4.6 s for this list; BenchmarkAccessRuleOpen measures
// it now.)
func TestOpenCheckOfALongList(t *testing.T) {
	var r AccessRule
	if err := r.Decode(longAllow(16384)); err != nil {
		t.Fatal(err)
	}
	if got := r.open(); got != "" {
		t.Fatalf("open() = %q for a list of host addresses, want \"\"", got)
	}
}

// BenchmarkAccessRuleOpen is the start-up check on the longest list an
// environment string holds.
func BenchmarkAccessRuleOpen(b *testing.B) {
	var r AccessRule
	if err := r.Decode(longAllow(16384)); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		r.open()
	}
}
