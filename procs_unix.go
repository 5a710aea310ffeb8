//go:build unix

package main

import (
	"syscall"
	"time"
)

// procsAdapt is whether adaptProcs may run: here the process's CPU time
// can be read.
const procsAdapt = true

// processCPU returns the CPU time the process has used, its user and
// system time over every thread.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
