package dnsserver

import (
	"context"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

const reusePortSupported = true

// listenReusePort binds a UDP socket with SO_REUSEPORT, so that several
// sockets share the port and the kernel spreads clients over them.
func listenReusePort(ap netip.AddrPort) (*net.UDPConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) })
		if err != nil {
			return err
		}
		return serr
	}}
	pc, err := lc.ListenPacket(context.Background(), "udp", ap.String())
	if err != nil {
		return nil, err
	}
	return pc.(*net.UDPConn), nil
}
