//go:build !unix

package main

import "time"

// procsAdapt is false where the process's CPU time cannot be read: the P
// count stays Go's default.
const procsAdapt = false

func processCPU() time.Duration { return 0 }
