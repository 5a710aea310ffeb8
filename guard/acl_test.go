package guard

import (
	"net/netip"
	"testing"
)

func TestDefaultAccessList(t *testing.T) {
	tests := []struct {
		addr string
		in   bool
	}{
		{"127.0.0.1", true},
		{"127.255.255.255", true},
		{"128.0.0.0", false},
		{"10.0.0.0", true},
		{"10.255.255.255", true},
		{"11.0.0.0", false},
		{"172.15.255.255", false},
		{"172.16.0.0", true},
		{"172.31.255.255", true},
		{"172.32.0.0", false},
		{"192.168.0.1", true},
		{"192.169.0.1", false},
		{"100.63.255.255", false},
		{"100.64.0.0", true},
		{"100.127.255.255", true},
		{"100.128.0.0", false},
		{"169.254.1.1", true},
		{"169.255.0.0", false},
		{"192.0.2.1", false},
		{"::ffff:10.1.2.3", true},
		{"::ffff:192.0.2.1", false},
		{"::1", true},
		{"::2", false},
		{"::", false},
		{"fc00::1", true},
		{"fdff:ffff::1", true},
		{"fe00::1", false},
		{"fe80::1", true},
		{"fe80::1%eth0", true},
		{"febf:ffff::1", true},
		{"fec0::1", false},
		{"2001:db8::1", false},
	}
	acl := DefaultAccessList()
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			if got := acl.Contains(netip.MustParseAddr(tt.addr)); got != tt.in {
				t.Fatalf("Contains(%s) = %v, want %v", tt.addr, got, tt.in)
			}
		})
	}
}

func TestAccessListContains(t *testing.T) {
	tests := []struct {
		name     string
		prefixes []string
		addr     string
		in       bool
	}{
		{"empty list", nil, "127.0.0.1", false},
		{"host bits of a prefix are ignored", []string{"127.1.2.3/8"}, "127.9.9.9", true},
		{"/32", []string{"127.0.0.1/32"}, "127.0.0.1", true},
		{"/32, the next host", []string{"127.0.0.1/32"}, "127.0.0.2", false},
		{"/0 holds every IPv4 client", []string{"0.0.0.0/0"}, "203.0.113.1", true},
		{"/0 for IPv4 holds no IPv6 client", []string{"0.0.0.0/0"}, "2001:db8::1", false},
		{"::/0 holds every IPv6 client", []string{"::/0"}, "2001:db8::1", true},
		{"::/0 holds no IPv4 client, mapped or not", []string{"::/0"}, "::ffff:127.0.0.1", false},
		{"a mapped prefix reads as IPv4", []string{"::ffff:127.0.0.0/104"}, "127.1.2.3", true},
		{"a mapped prefix, outside", []string{"::ffff:127.0.0.0/104"}, "128.1.2.3", false},
		{"/128", []string{"2001:db8::1/128"}, "2001:db8::1", true},
		{"/128, the next host", []string{"2001:db8::1/128"}, "2001:db8::2", false},
		{"many lengths, the longest matches", []string{"10.0.0.0/8", "127.0.0.1/32", "2001:db8::/32"}, "127.0.0.1", true},
		{"many lengths, none matches", []string{"10.0.0.0/8", "127.0.0.1/32", "2001:db8::/32"}, "127.0.0.2", false},
		{"duplicates and nesting", []string{"127.0.0.0/8", "127.0.0.0/8", "127.0.0.0/16"}, "127.0.1.1", true},
		{"the zero Addr", []string{"0.0.0.0/0", "::/0"}, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var prefixes []netip.Prefix
			for _, s := range tt.prefixes {
				prefixes = append(prefixes, netip.MustParsePrefix(s))
			}
			var addr netip.Addr
			if tt.addr != "" {
				addr = netip.MustParseAddr(tt.addr)
			}
			if got := NewAccessList(prefixes...).Contains(addr); got != tt.in {
				t.Fatalf("%v: Contains(%v) = %v, want %v", tt.prefixes, addr, got, tt.in)
			}
		})
	}
}

func TestAccessListNilHoldsNothing(t *testing.T) {
	var acl *AccessList
	if acl.Contains(netip.MustParseAddr("127.0.0.1")) {
		t.Fatal("the nil list holds 127.0.0.1")
	}
}

func TestNewAccessListRejectsInvalid(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic on the zero Prefix")
		}
	}()
	NewAccessList(netip.Prefix{})
}

func TestAccessListAllocs(t *testing.T) {
	acl := DefaultAccessList()
	for _, s := range []string{"127.0.0.1", "192.0.2.1", "::ffff:10.0.0.1", "fe80::1%eth0", "2001:db8::1"} {
		addr := netip.MustParseAddr(s)
		if n := testing.AllocsPerRun(1000, func() { acl.Contains(addr) }); n != 0 {
			t.Errorf("Contains(%s) allocates %v times per call, want 0", s, n)
		}
	}
}
