package main

import (
	"os"
	"os/exec"
	"testing"
)

// The proxy builds for the systems an edge box or a developer runs besides
// Linux: a FreeBSD router, a Mac. What is Linux's alone (SO_REUSEPORT
// steering, the ICMP error ENONET) stays behind build tags there. FreeBSD
// stands for both: a Mac takes the same files, and each system compiles
// the standard library anew, a minute or more of CI on a cold cache.
func TestBuildsForFreeBSD(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles the standard library: not in -short")
	}
	for _, goos := range []string{"freebsd"} {
		cmd := exec.Command("go", "build", "-o", os.DevNull, ".")
		cmd.Env = append(os.Environ(), "GOOS="+goos, "GOARCH=amd64", "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("GOOS=%s go build: %v\n%s", goos, err, out)
		}
	}
}
