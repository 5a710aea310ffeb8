//go:build unix

package dnsserver

import "syscall"

// setReadBuffer sets a socket's receive buffer (SO_RCVBUF) to n bytes.
func setReadBuffer(fd uintptr, n int) {
	syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, n)
}
