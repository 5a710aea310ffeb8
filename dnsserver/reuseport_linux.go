package dnsserver

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

const reusePortSupported = true

// listenReusePort binds a UDP socket with SO_REUSEPORT, so that several
// sockets share the port and the kernel spreads clients over them.
func listenReusePort(ap netip.AddrPort) (*net.UDPConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error { return setReusePort(c) }}
	pc, err := lc.ListenPacket(context.Background(), "udp", ap.String())
	if err != nil {
		return nil, err
	}
	return pc.(*net.UDPConn), nil
}

// listenFirst binds the first of the server's UDP sockets, alone if it
// can, and then lets the others join it (SO_REUSEPORT, which the kernel
// allows after the bind): a socket that opened the port is the first of
// the kernel's reuse-port group, index 0 to focusUDP, for as long as it is
// open. Bound with SO_REUSEPORT from the start, it would join the group of
// any socket of the same user already on the port, as the last, and with
// port 0 the kernel may even pick such a port. Where sockets of the same
// user hold the port already, it joins them as before, and reports it
// (shared): the group's first is then one of theirs.
func listenFirst(ap netip.AddrPort) (conn *net.UDPConn, shared bool, err error) {
	var lc net.ListenConfig
	pc, err := lc.ListenPacket(context.Background(), "udp", ap.String())
	if errors.Is(err, syscall.EADDRINUSE) {
		conn, err = listenReusePort(ap)
		return conn, true, err
	}
	if err != nil {
		return nil, false, err
	}
	conn = pc.(*net.UDPConn)
	rc, err := conn.SyscallConn()
	if err == nil {
		err = setReusePort(rc)
	}
	if err != nil {
		conn.Close()
		return nil, false, err
	}
	return conn, false, nil
}

// setReusePort sets SO_REUSEPORT on c.
func setReusePort(c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) })
	if err != nil {
		return err
	}
	return serr
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
