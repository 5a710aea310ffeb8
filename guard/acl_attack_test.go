package guard

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// TestAccessListMatchesNetip is an attack on the access list: random lists
// of IPv4, IPv6 and IPv4-mapped prefixes of every length (0, 32 and 128
// included), overlapping and duplicated, against random addresses near
// their edges, each answer compared with netip's own Prefix.Contains under
// the list's stated rules (an IPv4-mapped address and a mapped prefix of
// /96 or longer are IPv4; families never cross; the zone is ignored).
func TestAccessListMatchesNetip(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	randAddr := func() netip.Addr {
		switch rng.IntN(4) {
		case 0:
			var b [4]byte
			for i := range b {
				b[i] = byte(rng.IntN(4) * 64)
				if rng.IntN(2) == 0 {
					b[i] = byte(rng.Uint32())
				}
			}
			return netip.AddrFrom4(b)
		case 1:
			var b [4]byte
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			return netip.AddrFrom16(netip.AddrFrom4(b).As16()) // mapped
		default:
			var b [16]byte
			for i := range b {
				if rng.IntN(3) == 0 {
					b[i] = byte(rng.Uint32())
				}
			}
			if rng.IntN(3) == 0 {
				b[10], b[11] = 0xff, 0xff
				b[rng.IntN(12)] ^= 1 << rng.IntN(8) // near the mapped block
			}
			a := netip.AddrFrom16(b)
			if rng.IntN(5) == 0 && !a.Is4In6() {
				a = a.WithZone("eth0")
			}
			return a
		}
	}
	norm := func(p netip.Prefix) netip.Prefix {
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Masked()
		}
		return p.Masked()
	}
	for run := range 3000 {
		var prefixes []netip.Prefix
		for range 1 + rng.IntN(6) {
			a := randAddr().WithZone("")
			bits := rng.IntN(a.BitLen() + 1)
			if rng.IntN(3) == 0 {
				bits = min(a.BitLen(), []int{0, a.BitLen(), a.BitLen() - 1, 96, 95, 1}[rng.IntN(6)])
			}
			prefixes = append(prefixes, netip.PrefixFrom(a, bits))
		}
		acl := NewAccessList(prefixes...)
		for range 200 {
			var addr netip.Addr
			if rng.IntN(2) == 0 {
				p := prefixes[rng.IntN(len(prefixes))]
				b := p.Addr().As16()
				if p.Addr().Is4() {
					b4 := p.Addr().As4()
					b4[rng.IntN(4)] ^= byte(rng.Uint32())
					addr = netip.AddrFrom4(b4)
				} else {
					b[rng.IntN(16)] ^= byte(1 << rng.IntN(8))
					addr = netip.AddrFrom16(b)
				}
			} else {
				addr = randAddr()
			}
			want := false
			client := addr.WithZone("").Unmap()
			for _, p := range prefixes {
				if n := norm(p); n.Addr().Is4() == client.Is4() && n.Contains(client) {
					want = true
				}
			}
			if got := acl.Contains(addr); got != want {
				t.Fatalf("run %d: %v: Contains(%v) = %v, want %v", run, prefixes, addr, got, want)
			}
		}
	}
}
