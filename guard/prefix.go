package guard

// Client addresses as 128-bit numbers, shared by the per-client table and
// the access list. An IPv4 address, and an IPv4-mapped IPv6 one, is kept in
// its mapped form ::ffff:a.b.c.d; a prefix of it clears host bits of the
// last 32 only, so the ::ffff marker stays. No masked IPv6 key can equal an
// IPv4 key: an address inside ::ffff:0:0/96 is IPv4 before it is masked, and
// masking an IPv6 address either keeps all of its first 96 bits (so it stays
// outside ::ffff:0:0/96) or clears bit 95, which every IPv4 key has set.

import (
	"cmp"
	"encoding/binary"
	"net/netip"
)

// clientKey is an address, or an address cut to a prefix, as a number.
type clientKey struct{ hi, lo uint64 }

// prefixMask keeps the leading bits of a clientKey that name a prefix.
type prefixMask struct{ hi, lo uint64 }

// v4Mask keeps the ::ffff marker and the first bits bits of the IPv4 address.
func v4Mask(bits int) prefixMask {
	return prefixMask{hi: ^uint64(0), lo: 0xffffffff_00000000 | uint64(^uint32(0)<<(32-bits))}
}

// v6Mask keeps the first bits bits of an IPv6 address. (A shift by 64 or more
// gives 0 in Go, which is what /0 and the empty half of a short prefix need.)
func v6Mask(bits int) prefixMask {
	m := prefixMask{hi: ^uint64(0) << (64 - min(bits, 64))}
	if bits > 64 {
		m.lo = ^uint64(0) << (128 - bits)
	}
	return m
}

// addrKey returns addr as a number with whether it is IPv4 (mapped IPv6
// included); ok is false for the zero Addr. The zone, if any, is dropped.
// It does not allocate.
func addrKey(addr netip.Addr) (k clientKey, is4, ok bool) {
	switch {
	case addr.Is4(): // the most common client first, in the fewest steps
		b := addr.As4()
		return clientKey{lo: 0xffff<<32 | uint64(binary.BigEndian.Uint32(b[:]))}, true, true
	case !addr.IsValid():
		return clientKey{}, false, false
	}
	b := addr.As16() // a mapped IPv4 address is already in the form above
	return clientKey{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}, addr.Is4In6(), true
}

// masked returns k with the bits outside m cleared.
func (k clientKey) masked(m prefixMask) clientKey {
	return clientKey{k.hi & m.hi, k.lo & m.lo}
}

// compareKeys orders keys as the numbers they are.
func compareKeys(a, b clientKey) int {
	if c := cmp.Compare(a.hi, b.hi); c != 0 {
		return c
	}
	return cmp.Compare(a.lo, b.lo)
}
