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

// focusUDP has the kernel deliver every packet for the port of c's
// reuse-port group to the group's first socket (one), or spread them over
// all the group's sockets again by client address, as it does by default.
// A classic BPF program attached to any socket of the group returns the
// index of the socket to deliver to, in the order the sockets were bound:
// 0 is the first. An index beyond the group gives the choice back to the
// kernel (socket(7), SO_ATTACH_REUSEPORT_CBPF), which, unlike detaching the
// program, every kernel with such programs (4.5 on) understands.
func focusUDP(c *net.UDPConn, one bool) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	index := uint32(0)
	if !one {
		index = ^uint32(0) // no such socket: the kernel's own spread
	}
	prog := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: index}}
	var serr error
	err = rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_REUSEPORT_CBPF,
			&unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]})
	})
	if err != nil {
		return err
	}
	return serr
}
