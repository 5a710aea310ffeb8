//go:build !linux

package dnsserver

import (
	"net"
	"net/netip"
)

const reusePortSupported = false

func listenReusePort(ap netip.AddrPort) (*net.UDPConn, error) {
	return net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap))
}

// focusUDP does nothing here: the server listens on one socket.
func focusUDP(*net.UDPConn, bool) error { return nil }
