package batchio

import (
	"net/netip"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestLinkLocalClientKeepsItsScope proves that an answer to a client on an
// IPv6 link-local address goes back to the interface the query came in
// on: the address a reader decodes, encoded again by a writer, must keep
// the socket address's scope. Without it the answer to a client that
// DNS_ALLOW=local admits goes out with no interface: the kernel then
// refuses it or routes it out of whichever interface its table gives
// for fe80::/64, so on a host with two links the client gets no answer.
func TestLinkLocalClientKeepsItsScope(t *testing.T) {
	for _, tc := range []struct {
		addr  string
		scope uint32
	}{
		{"fe80::1", 4},
		{"fe80::fc:ff:fe00:1", 2},
	} {
		var in unix.RawSockaddrAny
		sa := (*unix.RawSockaddrInet6)(unsafe.Pointer(&in))
		sa.Family = unix.AF_INET6
		sa.Addr = netip.MustParseAddr(tc.addr).As16()
		sa.Port = 0x3515 // any port; byte order does not matter for the scope
		sa.Scope_id = tc.scope

		ap := decodeAddr(&in, unix.SizeofSockaddrInet6)
		var out unix.RawSockaddrAny
		encodeAddr(&out, ap, true)
		got := (*unix.RawSockaddrInet6)(unsafe.Pointer(&out))
		if got.Addr != sa.Addr {
			t.Errorf("%s%%%d: address %v, want %v", tc.addr, tc.scope, netip.AddrFrom16(got.Addr), tc.addr)
		}
		if got.Scope_id != tc.scope {
			t.Errorf("%s%%%d: the answer goes out with scope %d (decoded as %v): a link-local destination without its interface",
				tc.addr, tc.scope, got.Scope_id, ap)
		}
	}
}
