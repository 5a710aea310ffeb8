package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// errAddrSyntax is an address that is not host:port, whatever the names resolve to.
var errAddrSyntax = errors.New("not host:port")

// loopback is what localhost means, without asking anyone (RFC 6761 §6.3).
var loopback = netip.AddrFrom4([4]byte{127, 0, 0, 1})

// resolveAddr reads host:port under the one rule of every address variable:
// the host is an IP address, localhost (any case, trailing dot or not, and
// its subdomains) or a host name, which r resolves now, once, to its first
// address (IPv4 first); the port is decimal, and 0 only where anyPort
// allows it (a listener taking a free port).
func resolveAddr(s string, anyPort bool, r resolver) (netip.AddrPort, error) {
	host, portText, err := net.SplitHostPort(s)
	if err != nil || host == "" {
		return netip.AddrPort{}, errAddrSyntax
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil || (port == 0 && !anyPort) {
		return netip.AddrPort{}, errAddrSyntax
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return netip.AddrPortFrom(ip, uint16(port)), nil
	}
	if isLocalhost(host) {
		return netip.AddrPortFrom(loopback, uint16(port)), nil
	}
	if !isHostName(host) {
		return netip.AddrPort{}, errAddrSyntax
	}
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	defer cancel()
	ips, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if len(ips) == 0 {
		return netip.AddrPort{}, fmt.Errorf("%s has no address", host)
	}
	ip := ips[0].Unmap()
	for _, a := range ips {
		if a.Unmap().Is4() {
			ip = a.Unmap()
			break
		}
	}
	return netip.AddrPortFrom(ip, uint16(port)), nil
}

// addrError is the one-line error for an address variable that failed
// resolveAddr: want is what its syntax must be.
func addrError(key, value, want string, err error) error {
	if errors.Is(err, errAddrSyntax) {
		return fmt.Errorf("%s=%q: must be %s", key, value, want)
	}
	why := strings.ReplaceAll(err.Error(), "\n", " ")
	if transientLookup(err) {
		return &lookupError{fmt.Sprintf("%s=%q: its host could not be looked up for now (%s); try again", key, value, why)}
	}
	return fmt.Errorf("%s=%q: must name a host that resolves (%s)", key, value, why)
}

// lookupError is a host name that could not be looked up at start-up for
// a reason that may pass (the resolver timed out or answered SERVFAIL):
// not a bad value, so run exits 1, which a service manager restarts, and
// not 2, which it takes for a configuration to fix and never restarts
// (TestAttackTransientLookupFailureExitsAsConfigError).
type lookupError struct{ msg string }

func (e *lookupError) Error() string { return e.msg }

// transientLookup reports whether err is a host lookup that failed for a
// reason that may pass: the resolver timed out or answered SERVFAIL.
func transientLookup(err error) bool {
	var dnsErr *net.DNSError
	return errors.As(err, &dnsErr) && !dnsErr.IsNotFound && (dnsErr.IsTimeout || dnsErr.IsTemporary)
}

// isLocalhost reports whether host is localhost or under it.
func isLocalhost(host string) bool {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	return h == "localhost" || strings.HasSuffix(h, ".localhost")
}

// isHostName reports whether s can be looked up as a host name: labels of
// 1..63 letters, digits, hyphens (underscores too, as in service names),
// 253 characters in all, an optional final dot. Anything else is refused
// before a resolver sees it.
func isHostName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// sharePort reports whether TCP listeners on a and b would take the same
// port: the same port number (0 picks a free one, never shared) on the same
// address, or on a wildcard that covers the other (the IPv6 wildcard is
// dual-stack and covers IPv4 too).
func sharePort(a, b netip.AddrPort) bool {
	if a.Port() != b.Port() || a.Port() == 0 {
		return false
	}
	x, y := a.Addr().Unmap(), b.Addr().Unmap()
	return x == y || covers(x, y) || covers(y, x)
}

// covers reports whether a listener on wildcard w also takes traffic to a.
func covers(w, a netip.Addr) bool {
	return w.IsUnspecified() && (w.Is6() || a.Is4())
}

// loops reports whether queries sent to up would reach the listener on ln.
func loops(ln, up netip.AddrPort) bool {
	if ln.Port() != up.Port() || ln.Port() == 0 {
		return false
	}
	l, u := ln.Addr().Unmap(), up.Addr().Unmap()
	local := u.IsLoopback() || u.IsUnspecified() // the unspecified address dials this host
	return l == u || (local && covers(l, u)) || (u.IsUnspecified() && l.IsLoopback())
}
