//go:build !linux

package upstream

import "syscall"

// icmpErrors are Linux's list (readerr_linux.go) without ENONET, which
// only Linux has: other kernels report an ICMP error about a packet a
// connected UDP socket sent as some of the same errors.
var icmpErrors = [...]syscall.Errno{
	syscall.ECONNREFUSED, syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.EHOSTDOWN,
	syscall.ENOPROTOOPT, syscall.EACCES, syscall.EPROTO, syscall.EMSGSIZE, syscall.EOPNOTSUPP,
}
