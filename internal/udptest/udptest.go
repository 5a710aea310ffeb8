//go:build unix

// Package udptest helps tests look at UDP sockets on loopback.
package udptest

import (
	"net"
	"syscall"
	"testing"
)

// Listen returns a UDP socket on 127.0.0.1, closed when the test ends.
func Listen(t testing.TB) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Waiting reports whether a datagram waits on c, without waiting for one or
// taking it. Loopback delivers a datagram within the sender's system call,
// so a test can tell whether something was sent by the time it asks.
func Waiting(t testing.TB, c *net.UDPConn) bool {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Error(err)
		return false
	}
	n := -1
	rc.Read(func(fd uintptr) bool {
		n, _, _ = syscall.Recvfrom(int(fd), make([]byte, 512), syscall.MSG_DONTWAIT|syscall.MSG_PEEK)
		return true
	})
	return n > 0
}
