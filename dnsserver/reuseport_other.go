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

// listenFirst binds the server's one socket: nobody shares its port.
func listenFirst(ap netip.AddrPort) (*net.UDPConn, bool, error) {
	conn, err := listenReusePort(ap)
	return conn, false, err
}

// focusUDP does nothing here: the server listens on one socket.
func focusUDP(*net.UDPConn, bool) error { return nil }
