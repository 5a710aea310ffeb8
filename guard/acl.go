package guard

// The access list, as the chapter states it:
//
//   - A list is a set of prefixes; Contains(addr) reports whether any of
//     them holds addr. An IPv4-mapped IPv6 address is checked as IPv4.
//   - An IPv4 prefix holds IPv4 clients only and an IPv6 prefix IPv6 clients
//     only, even ::/0; ::ffff:0:0/96 and longer are read as IPv4 prefixes.
//   - A forwarder open to the whole Internet is an amplifier for anyone who
//     can spoof a source address, so the default list holds only local and
//     private networks: loopback, RFC 1918, RFC 6598 shared address space,
//     IPv6 unique local and link-local.
//
// Prefixes are grouped by length; each group is a sorted array searched by
// halving, so Contains costs one masked binary search per length present and
// allocates nothing.

import (
	"fmt"
	"net/netip"
	"slices"
)

// AccessList is a set of address prefixes. It is immutable once built, so it
// is safe for concurrent use. Build it with NewAccessList or DefaultAccessList;
// the nil list holds nothing.
type AccessList struct {
	v4, v6 []prefixGroup
}

// prefixGroup holds the prefixes of one family and one length.
type prefixGroup struct {
	mask prefixMask
	bits int
	keys []clientKey // masked, sorted, no duplicates
}

// NewAccessList returns the list of prefixes. A prefix with host bits set
// stands for its network (10.1.2.3/8 is 10.0.0.0/8).
// It panics on an invalid prefix; callers validate configuration first.
func NewAccessList(prefixes ...netip.Prefix) *AccessList {
	a := &AccessList{}
	for _, p := range prefixes {
		if !p.IsValid() {
			panic(fmt.Sprintf("guard: access list prefix %v is not valid", p))
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		groups, mask := &a.v6, v6Mask(p.Bits())
		if p.Addr().Is4() {
			groups, mask = &a.v4, v4Mask(p.Bits())
		}
		k, _, _ := addrKey(p.Addr())
		g := groupOf(groups, p.Bits(), mask)
		g.keys = append(g.keys, k.masked(mask))
	}
	for _, groups := range [][]prefixGroup{a.v4, a.v6} {
		for i := range groups {
			slices.SortFunc(groups[i].keys, compareKeys)
			groups[i].keys = slices.Compact(groups[i].keys)
		}
	}
	return a
}

// groupOf returns the group for prefixes of length bits, adding it if needed.
func groupOf(groups *[]prefixGroup, bits int, mask prefixMask) *prefixGroup {
	for i := range *groups {
		if (*groups)[i].bits == bits {
			return &(*groups)[i]
		}
	}
	*groups = append(*groups, prefixGroup{mask: mask, bits: bits})
	return &(*groups)[len(*groups)-1]
}

// DefaultAccessList returns the list a forwarder should answer when nobody
// chose one: the prefixes of DefaultAccessPrefixes.
func DefaultAccessList() *AccessList {
	return NewAccessList(DefaultAccessPrefixes()...)
}

// DefaultAccessPrefixes returns, in a fresh slice, the local and private
// networks: loopback (127.0.0.0/8, ::1/128), RFC 1918 (10.0.0.0/8,
// 172.16.0.0/12, 192.168.0.0/16), RFC 6598 (100.64.0.0/10), link-local
// (169.254.0.0/16, fe80::/10) and IPv6 unique local (fc00::/7).
func DefaultAccessPrefixes() []netip.Prefix {
	var prefixes []netip.Prefix
	for _, s := range []string{
		"127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
		"100.64.0.0/10", "169.254.0.0/16",
		"::1/128", "fc00::/7", "fe80::/10",
	} {
		prefixes = append(prefixes, netip.MustParsePrefix(s))
	}
	return prefixes
}

// Contains reports whether a prefix of the list holds addr. The zero Addr is
// in no list. It does not allocate.
func (a *AccessList) Contains(addr netip.Addr) bool {
	if a == nil {
		return false
	}
	k, is4, ok := addrKey(addr)
	if !ok {
		return false
	}
	groups := a.v6
	if is4 {
		groups = a.v4
	}
	for i := range groups {
		g := &groups[i]
		if _, found := slices.BinarySearchFunc(g.keys, k.masked(g.mask), compareKeys); found {
			return true
		}
	}
	return false
}
