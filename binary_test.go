package main

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// buildBinary builds dnsproxi into a temporary directory for the test, as
// make build does (stamped with the VCS revision where there is one), and
// returns its path.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dnsproxi")
	cmd := exec.Command("go", "build", "-buildvcs=auto", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}
