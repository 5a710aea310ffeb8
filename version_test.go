package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"dnsproxi/guard"
)

// dnsproxi -version prints one line: the module version, the VCS revision
// and the Go version, then exits 0 without reading the configuration.
func TestVersionFlag(t *testing.T) {
	for _, arg := range []string{"-version", "--version"} {
		t.Run(arg, func(t *testing.T) {
			setEnv(t, map[string]string{"DNS_UPSTREAM": "not an address"}) // never read
			var stdout, stderr syncBuffer
			if code := run(context.Background(), []string{arg}, &stdout, &stderr, nil); code != 0 {
				t.Fatalf("exit %d, want 0; stderr %q", code, stderr.String())
			}
			out := stdout.String()
			if !strings.HasPrefix(out, "dnsproxi ") || !strings.Contains(out, runtime.Version()) ||
				strings.Count(out, "\n") != 1 || !strings.Contains(out, "revision ") {
				t.Errorf("-version printed %q: want one line: dnsproxi, its version, its revision, %s", out, runtime.Version())
			}
		})
	}
}

// dnsproxi_build_info says what -version says, with the value 1.
func TestBuildInfoMetric(t *testing.T) {
	up := startUpstream(t)
	cfg := testConfig(up.Addr())
	cfg.MetricsAddr = "127.0.0.1:0"
	page := scrape(t, startProxy(t, cfg, guard.RealClock{}))
	v := readBuildVersion()
	want := `dnsproxi_build_info{goversion="` + runtime.Version() + `",revision="` + v.Revision + `",version="` + v.Version + `"} 1`
	if !strings.Contains(page, want+"\n") {
		t.Errorf("/metrics lacks %s", want)
	}
}

// A binary built from the repository names its commit: the revision comes
// from the VCS stamp go build writes, not from a hand-kept constant.
func TestVersionNamesCommit(t *testing.T) {
	// go build stamps the revision only from a .git directory: a source
	// tarball has none, and a git worktree has a .git file it does not read.
	if fi, err := os.Stat(".git"); err != nil || !fi.IsDir() {
		t.Skip("no .git directory here: go build stamps no revision")
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	bin := buildBinary(t)
	out, err := exec.Command(bin, "-version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if rev := strings.TrimSpace(string(head)); !strings.Contains(string(out), "revision "+rev) {
		t.Errorf("%s -version = %q, want revision %s", filepath.Base(bin), out, rev)
	}
}
