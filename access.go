package main

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"dnsproxi/dnsserver"
	"dnsproxi/guard"
	"dnsproxi/metrics"
)

// How many REFUSED answers denied UDP queries get, in all: a client outside
// the access list by mistake learns that it is refused, and a flood forging
// a victim's address makes the proxy send it at most deniedRate small
// answers a second. Beyond it, denied UDP queries are dropped.
const (
	deniedRate  = 10
	deniedBurst = 1 // 11 at most in any second (a burst of 10 let 20 through after a quiet spell)
)

// AccessRule is DNS_ALLOW: the clients that may query. The zero value is
// the default list (local and private networks).
type AccessRule struct {
	Any      bool           // any: every address may query
	Prefixes []netip.Prefix // the list, when not Any; nil: the default list
}

// open names the address families every address of which the rule lets
// query ("IPv4", "IPv6", both, or "" for none): any, or a list that covers a
// whole family however it is written (0.0.0.0/0; ::ffff:0:0/96, which the
// access list reads as IPv4; 0.0.0.0/1 with 128.0.0.0/1).
func (r AccessRule) open() string {
	if r.Any {
		return "IPv4 and IPv6"
	}
	var v4, v6 []addrRange
	for _, p := range r.Prefixes {
		if p.Addr().Is4In6() && p.Bits() >= 96 { // as the access list reads it
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if p.Addr().Is4() {
			v4 = append(v4, rangeOf(p.Masked(), 32))
		} else {
			v6 = append(v6, rangeOf(p.Masked(), 128))
		}
	}
	all4, all6 := coversAll(v4, u128{0, 1<<32 - 1}), coversAll(v6, u128{^uint64(0), ^uint64(0)})
	switch {
	case all4 && all6:
		return "IPv4 and IPv6"
	case all4:
		return "IPv4"
	case all6:
		return "IPv6"
	}
	return ""
}

// u128 is an address as a number: IPv4 in the low 32 bits.
type u128 struct{ hi, lo uint64 }

func (a u128) less(b u128) bool { return a.hi < b.hi || a.hi == b.hi && a.lo < b.lo }

// addrRange is the first and last address of a prefix.
type addrRange struct{ first, last u128 }

// rangeOf returns the addresses of p, a masked prefix of a family width
// bits wide.
func rangeOf(p netip.Prefix, width int) addrRange {
	var first u128
	if width == 32 {
		b := p.Addr().As4()
		first.lo = uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])
	} else {
		b := p.Addr().As16()
		for i := range 8 {
			first.hi = first.hi<<8 | uint64(b[i])
			first.lo = first.lo<<8 | uint64(b[8+i])
		}
	}
	host := width - p.Bits() // the bits that vary: set them all for the last address
	last := first
	switch {
	case host >= 64:
		last.lo = ^uint64(0)
		if host == 128 {
			last.hi = ^uint64(0)
		} else {
			last.hi |= 1<<(host-64) - 1
		}
	case host > 0:
		last.lo |= 1<<host - 1
	}
	return addrRange{first, last}
}

// coversAll reports whether the ranges together hold every address from 0
// to top: sorted by their first address, each must start at or before the
// first address the ones before it left uncovered. It takes n log n for n
// ranges (a check node by node of the prefixes' tree took seconds for a
// list of some thousands of hosts).
func coversAll(rs []addrRange, top u128) bool {
	slices.SortFunc(rs, func(a, b addrRange) int {
		switch {
		case a.first.less(b.first):
			return -1
		case b.first.less(a.first):
			return 1
		}
		return 0
	})
	var next u128 // the first address not yet covered
	for _, r := range rs {
		if next.less(r.first) {
			return false // a gap
		}
		if !r.last.less(next) {
			if r.last == top {
				return true
			}
			next = r.last
			if next.lo++; next.lo == 0 {
				next.hi++
			}
		}
	}
	return false
}

var errAllow = errors.New("must be any, or a comma-separated list of CIDR prefixes or addresses (such as 192.0.2.0/24, 2001:db8::/32), local for the default networks")

// Decode parses any, or a comma-separated list of prefixes and addresses in
// which local stands for the default networks (any case).
func (r *AccessRule) Decode(s string) error {
	if strings.EqualFold(strings.TrimSpace(s), "any") {
		*r = AccessRule{Any: true}
		return nil
	}
	var prefixes []netip.Prefix
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if strings.EqualFold(item, "local") {
			prefixes = append(prefixes, guard.DefaultAccessPrefixes()...)
			continue
		}
		p, ok := parsePrefix(item)
		if !ok {
			return errAllow
		}
		prefixes = append(prefixes, p)
	}
	*r = AccessRule{Prefixes: prefixes}
	return nil
}

// String describes the rule for the start-up log.
func (r AccessRule) String() string {
	switch {
	case r.Any:
		return "any"
	case r.Prefixes == nil:
		return "local"
	}
	return joinPrefixes(r.Prefixes)
}

// list is the access list the rule asks for; nil for any.
func (r AccessRule) list() *guard.AccessList {
	switch {
	case r.Any:
		return nil
	case r.Prefixes == nil:
		return guard.DefaultAccessList()
	}
	return guard.NewAccessList(r.Prefixes...)
}

// PrefixList is a comma-separated list of prefixes and addresses, as
// DNS_CLIENT_EXEMPT takes. The zero value is empty.
type PrefixList []netip.Prefix

var errPrefixList = errors.New("must be a comma-separated list of CIDR prefixes or addresses, such as 192.0.2.0/24, 2001:db8::/32")

// Decode parses the list.
func (l *PrefixList) Decode(s string) error {
	var prefixes PrefixList
	for _, item := range strings.Split(s, ",") {
		p, ok := parsePrefix(strings.TrimSpace(item))
		if !ok {
			return errPrefixList
		}
		prefixes = append(prefixes, p)
	}
	*l = prefixes
	return nil
}

// String formats the list as it is written.
func (l PrefixList) String() string {
	if len(l) == 0 {
		return "none"
	}
	return joinPrefixes(l)
}

// parsePrefix reads a CIDR prefix, or an address as the prefix of its own
// length. A zone (fe80::1%eth0) names an interface, not clients: refused.
func parsePrefix(s string) (netip.Prefix, bool) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), true
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, a.BitLen()), true
}

func joinPrefixes(prefixes []netip.Prefix) string {
	parts := make([]string, len(prefixes))
	for i, p := range prefixes {
		parts[i] = p.String()
	}
	return strings.Join(parts, ",")
}

// ClientPrefix is DNS_CLIENT_PREFIX: how many leading bits of a client's
// address name its bucket, for IPv4 and IPv6. 0 makes every address of the
// family one client.
type ClientPrefix struct {
	V4, V6 int
}

var errClientPrefix = errors.New("must be v4len,v6len: an IPv4 prefix length 0..32 and an IPv6 one 0..128, such as 32,64")

// Decode parses "v4len,v6len".
func (c *ClientPrefix) Decode(s string) error {
	v4, v6, ok := strings.Cut(s, ",")
	if !ok {
		return errClientPrefix
	}
	var p ClientPrefix
	var ok4, ok6 bool
	p.V4, ok4 = prefixLen(v4, 32)
	p.V6, ok6 = prefixLen(v6, 128)
	if !ok4 || !ok6 {
		return errClientPrefix
	}
	*c = p
	return nil
}

// String formats the lengths as they are written.
func (c ClientPrefix) String() string { return fmt.Sprintf("%d,%d", c.V4, c.V6) }

// prefixLen reads a prefix length from 0 to most, digits only.
func prefixLen(s string, most int) (int, bool) {
	s = strings.TrimSpace(s)
	n, err := strconv.Atoi(s)
	if err != nil || s == "" || strings.Trim(s, "0123456789") != "" || n > most {
		return 0, false
	}
	return n, true
}

// bits is a prefix length as guard takes it: 0 is guard.ZeroBits.
func bits(n int) int {
	if n == 0 {
		return guard.ZeroBits
	}
	return n
}

// initAccess builds the access list (nil: any), the bucket of REFUSED
// answers to denied UDP queries, and the per-client gate (nil: off).
func initAccess(cfg Config, clock guard.Clock) (*guard.AccessList, *guard.TokenBucket, *clientGates) {
	access := cfg.Allow.list()
	var denied *guard.TokenBucket
	if access != nil {
		denied = guard.NewTokenBucket(deniedRate, deniedBurst, clock)
	}
	if !cfg.ClientRateLimit.On() {
		return access, denied, nil
	}
	lc := guard.ClientLimiterConfig{
		Rate:      cfg.ClientRateLimit.Rate,
		Burst:     cfg.ClientRateLimit.Burst,
		V4Len:     bits(cfg.ClientPrefix.V4),
		V6Len:     bits(cfg.ClientPrefix.V6),
		TableSize: cfg.ClientTableSize,
		Exempt:    cfg.ClientExempt,
	}
	return access, denied, &clientGates{udp: guard.NewClientLimiter(lc, clock), tcp: guard.NewClientLimiter(lc, clock)}
}

// clientGates is the per-client gate: a table for each transport, with the
// same rules. A client's UDP queries and its TCP queries each get its share.
// Over UDP a flood can forge a victim's source and spend the victim's share,
// or fill the table with forged prefixes; over TCP the handshake proves the
// source, so neither reaches the TCP table, and a victim whose UDP share a
// forger spent still gets through over TCP. And a client that moves its
// excess to TCP (by itself, or following slip's TC answers) spends its own
// TCP share there, not the bucket every client shares
// (TestAttackFlooderOverTCPDrainsTheSharedBucket: with one table for UDP
// alone, one client's TCP queries took every shared token).
type clientGates struct {
	udp, tcp *guard.ClientLimiter
}

// of returns the table of q's transport.
func (g *clientGates) of(q *dnsserver.Query) *guard.ClientLimiter {
	if q.Net == "tcp" {
		return g.tcp
	}
	return g.udp
}

// entryGates asks q's client's bucket and the shared one (DNS_RATE_LIMIT)
// for a token each, both or neither, at the reading now; either may be off.
func (p *proxy) entryGates(q *dnsserver.Query, now time.Time) guard.Verdict {
	if p.clients != nil {
		return p.clients.of(q).AllowWithAt(now, q.Client.Addr(), p.limiter)
	}
	if p.limiter != nil && !p.limiter.AllowAt(now, 1) {
		return guard.RefusedByShared
	}
	return guard.Admitted
}

// clientStats reads the per-client tables for /metrics, both together;
// zeros while the gate is off.
func clientStats(g *clientGates) func() metrics.ClientStats {
	return func() metrics.ClientStats {
		if g == nil {
			return metrics.ClientStats{}
		}
		return metrics.ClientStats{Entries: g.udp.Len() + g.tcp.Len(), Evictions: g.udp.Evictions() + g.tcp.Evictions(),
			Overflows: g.udp.Overflows() + g.tcp.Overflows()}
	}
}
