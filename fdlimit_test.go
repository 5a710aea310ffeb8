//go:build unix

package main

import (
	"bufio"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startLimited runs the binary under a file descriptor limit of fds with
// env, and returns how it began: whether it served, the first line it
// wrote, its exit code if it exited, and every line up to then.
func startLimited(t *testing.T, bin string, fds int, env ...string) (started bool, line string, code int, all []string) {
	t.Helper()
	cmd := exec.Command("sh", "-c", `ulimit -Sn "$1" && ulimit -Hn "$1" && exec "$0"`, bin, itoa(fds))
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "DNS_LISTEN=127.0.0.1:0", "DNS_METRICS_ADDR=off", "DNS_UPSTREAM=127.0.0.1:5300"}, env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	defer func() { cmd.Process.Kill(); <-done }()
	lines := make(chan string, 16)
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		cmd.Wait()
		close(lines)
	}()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return false, line, cmd.ProcessState.ExitCode(), all
			}
			all = append(all, l)
			if line == "" {
				line = l
			}
			if strings.Contains(l, `msg=listening`) {
				return true, line, 0, all
			}
		case <-timeout:
			t.Fatal("the binary neither served nor exited within 20s")
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// A process whose file descriptor limit cannot hold DNS_TCP_MAX_CONNS
// connections beside its other sockets does not start: at the limit, accept
// would fail and no idle connection could be closed for a new client, so
// TCP would be shut to everyone. With a cap that fits it serves.
// Both run the binary on 2 cores (two UDP listeners) with one upstream and
// no metrics address: a reserve of 150.
func TestDescriptorLimitBelowTCPMaxConnsIsAConfigError(t *testing.T) {
	bin := buildBinary(t)
	started, line, code, _ := startLimited(t, bin, 512, "GOMAXPROCS=2", "DNS_TCP_MAX_CONNS=1000")
	if started || code != 2 {
		t.Fatalf("1000 TCP connections under 512 descriptors: started=%v exit %d, first line %q; want exit 2", started, code, line)
	}
	want := `dnsproxi: DNS_TCP_MAX_CONNS="1000": must leave 150 of the process's 512 file descriptors (ulimit -n) for its other sockets and files (upstreams 1×20, UDP listeners 2, closing connections 64, fixed 64): at most 362, or raise the limit`
	if line != want {
		t.Errorf("stderr %q\nwant   %q", line, want)
	}
	if started, line, _, _ := startLimited(t, bin, 512, "GOMAXPROCS=2", "DNS_TCP_MAX_CONNS=362"); !started {
		t.Errorf("362 TCP connections under 512 descriptors did not start: %q", line)
	}
}

// Left at its default, the cap fits itself to a low limit instead: the
// proxy starts, with the cap it can hold, and says so.
func TestDefaultTCPMaxConnsFitsALowDescriptorLimit(t *testing.T) {
	bin := buildBinary(t)
	started, line, code, all := startLimited(t, bin, 512, "GOMAXPROCS=2")
	if !started {
		t.Fatalf("the default cap under 512 descriptors did not start: exit %d, %q", code, line)
	}
	want := `level=WARN msg="DNS_TCP_MAX_CONNS: the default, 1000, lowered to 362: the process may open 512 file descriptors (ulimit -n) and keeps 150 for its other sockets and files"`
	if !strings.Contains(line, want) {
		t.Errorf("first line %q\nwant it to hold %q", line, want)
	}
	if listening := all[len(all)-1]; !strings.Contains(listening, "tcp_max_conns=362 ") {
		t.Errorf("started with %q, want tcp_max_conns=362", listening)
	}
}
