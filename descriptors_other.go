//go:build !unix

package main

// descriptorLimit returns 0 where the limit on open files is not read:
// nothing is checked.
func descriptorLimit() uint64 { return 0 }
