package upstream

import "syscall"

// icmpErrors are the errors the kernel reports for an ICMP error about a
// packet the socket sent (icmp_err_convert, icmpv6_err_convert, and
// EMSGSIZE for "fragmentation needed"). A UDP read reports them only for
// such a message.
var icmpErrors = [...]syscall.Errno{
	syscall.ECONNREFUSED, syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.EHOSTDOWN,
	syscall.ENONET, syscall.ENOPROTOOPT, syscall.EACCES, syscall.EPROTO, syscall.EMSGSIZE, syscall.EOPNOTSUPP,
}
