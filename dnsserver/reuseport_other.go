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
