//go:build unix

package main

import "syscall"

// descriptorLimit returns the process's limit on open file descriptors (the
// soft one, which the Go runtime raises to the hard one at start-up), or 0
// if it cannot be read or is unlimited.
func descriptorLimit() uint64 {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0
	}
	if cur := uint64(l.Cur); cur != ^uint64(0) { // int64 on some systems
		return cur
	}
	return 0
}
