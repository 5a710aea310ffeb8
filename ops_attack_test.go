package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
)

// A local client that fills the metrics address's 64 places with requests
// that announce a body and never send it holds them for good: the server
// reads the unread body after the handler (to reuse the connection), with
// no read deadline once the headers are in, so neither the 5 s header
// timeout, the 30 s idle timeout nor the 30 s write timeout frees a place.
// /healthz and /readyz then go unanswered: an orchestrator's liveness probe
// fails and restarts a proxy that serves DNS perfectly, and the scrape
// stops. The README promises that an idle connection frees its place
// within 30 s.
func TestAttackUnsentBodiesHoldTheMetricsListener(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out the metrics listener's 30 s timeouts")
	}
	up := startUpstream(t)
	cfg := testConfig(up.Addr())
	cfg.MetricsAddr = "127.0.0.1:0"
	a := startProxy(t, cfg, guard.RealClock{})
	addr := a.metricsLn.Addr().String()

	for i := range maxMetricsConns {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		// Headers whole, a 10-byte body announced and never sent.
		if _, err := fmt.Fprintf(c, "POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	// A place must free within the read timeout; the test gives it every
	// timeout of the listener (header 5 s, idle 30 s, write 30 s) with a
	// margin, asking again until then.
	c := &http.Client{Timeout: time.Second}
	limit := metricsIdleTimeout + metricsWriteTimeout/6
	deadline := time.Now().Add(limit)
	for {
		resp, err := c.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET /healthz: %d, want 200", resp.StatusCode)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /healthz %v after %d requests with an unsent body were opened: %v; want 200 (a place freed)",
				limit, maxMetricsConns, err)
		}
	}
}

// SIGHUP never ends the process, says the README; nor should a log line.
// But with stderr a pipe whose reader has gone (a log shipper that died,
// `dnsproxi 2>&1 | tee` whose tee was killed), the first line written after
// it, here SIGHUP's own "reopening the query log", kills the process with
// SIGPIPE: Go ends a program that writes to a broken pipe on fd 1 or 2
// unless SIGPIPE is notified or ignored. Losing a log line would be the
// harm; losing DNS for every client is what happens.
func TestAttackSIGHUPWithStderrReaderGoneKillsTheProxy(t *testing.T) {
	up := startUpstream(t)
	bin := buildBinary(t)
	dir := t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "DNS_LISTEN=127.0.0.1:0", "DNS_METRICS_ADDR=off",
		"DNS_UPSTREAM=" + up.Addr(), "DNS_QUERY_LOG=" + filepath.Join(dir, "queries.log")}
	cmd.Stderr = w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
		}
	})

	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(r)
		re := regexp.MustCompile(`msg=listening listen=(\S+)`)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				listening <- m[1]
				return
			}
		}
	}()
	var addr string
	select {
	case addr = <-listening:
	case err := <-exited:
		t.Fatalf("the binary exited before listening: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the binary did not start within 20s")
	}
	r.Close() // the log reader goes away
	if _, err := tryAsk("udp", addr, query("www.example.com", dns.TypeA), 2*time.Second); err != nil {
		t.Fatalf("before SIGHUP: %v", err)
	}

	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		t.Fatalf("SIGHUP with stderr's reader gone ended the process: %v (%s); want it serving", err, cmd.ProcessState)
	case <-time.After(3 * time.Second): // long enough for the queued line to be written
	}
	if m, err := tryAsk("udp", addr, query("www.example.com", dns.TypeA), 2*time.Second); err != nil || m.Rcode != dns.RcodeSuccess {
		t.Fatalf("after SIGHUP: %v; want an answer", err)
	}
}

// With stderr stalled (a log pipe nobody reads, a hung journal), SIGTERM
// still ends the process: the signal loop hears it (its lines are queued),
// the drain and the query log are bounded, and the event log gives up
// after asyncLogStopWait. But run's last lines, "stopped" (and "shutdown
// cut short"), are written straight to stderr, so the process never exits:
// systemd waits TimeoutStopSec (45 s) and kills it, and a restart leaves
// DNS down that long.
func TestAttackStalledStderrHoldsTheExit(t *testing.T) {
	up := startUpstream(t)
	setEnv(t, map[string]string{"DNS_LISTEN": "127.0.0.1:0", "DNS_UPSTREAM": up.Addr(), "DNS_METRICS_ADDR": "off"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stderr := &stallWriter{}
	t.Cleanup(stderr.release) // lets run finish once the test has judged it
	ready := make(chan *app, 1)
	exit := make(chan int, 1)
	go func() { exit <- run(ctx, nil, io.Discard, stderr, func(a *app) { ready <- a }) }()
	var a *app
	select {
	case a = <-ready:
	case code := <-exit:
		t.Fatalf("run exited %d before listening", code)
	case <-time.After(10 * time.Second):
		t.Fatal("run did not start listening")
	}
	ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA))

	stderr.stall()
	cancel() // SIGTERM
	// Nothing is in flight: the drain takes nothing; the event log's
	// writer is given up after asyncLogStopWait.
	limit := asyncLogStopWait + queryLogStopWait + 5*time.Second
	select {
	case code := <-exit:
		if code != 0 {
			t.Fatalf("exit %d, want 0", code)
		}
	case <-time.After(limit):
		t.Fatalf("run did not return within %v of SIGTERM with stderr stalled; want exit 0 (the drain is bounded)", limit)
	}
}

// A misspelled variable is read by no one: DNS_BREAKER_TRESHOLD=50 in
// /etc/default/dnsproxi starts a proxy with no breaker, and nothing says
// so. The README holds every value to its rule and refuses a cache
// variable set while the cache is off ("the operator meant something that
// would not happen"); a name no rule knows is the same mistake, and the
// start-up log is the least place to name it. (Not an exit: a Kubernetes
// service named "dns" puts DNS_PORT and DNS_SERVICE_HOST in every pod's
// environment.)
func TestAttackMisspelledVariableGoesUnnoticed(t *testing.T) {
	up := startUpstream(t)
	setEnv(t, map[string]string{"DNS_LISTEN": "127.0.0.1:0", "DNS_UPSTREAM": up.Addr(), "DNS_METRICS_ADDR": "off"})
	t.Setenv("DNS_BREAKER_TRESHOLD", "50")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs syncBuffer
	ready := make(chan *app, 1)
	exit := make(chan int, 1)
	go func() { exit <- run(ctx, nil, io.Discard, &logs, func(a *app) { ready <- a }) }()
	select {
	case <-ready:
	case code := <-exit:
		if code == 2 && strings.Contains(logs.String(), "DNS_BREAKER_TRESHOLD") {
			return // refused, naming it: also an answer
		}
		t.Fatalf("run exited %d: %s", code, logs.String())
	case <-time.After(10 * time.Second):
		t.Fatal("run did not start listening")
	}
	cancel()
	select {
	case <-exit:
	case <-time.After(5 * time.Second):
		t.Fatal("run did not return after its context ended")
	}
	if !strings.Contains(logs.String(), "DNS_BREAKER_TRESHOLD") {
		t.Fatalf("DNS_BREAKER_TRESHOLD=50 set: no line names it; the breaker is silently off:\n%s", logs.String())
	}
}

// The unit restarts the proxy on failure, but not on exit status 2
// (RestartPreventExitStatus=2), which it takes for a configuration error.
// The Go runtime ends a crashed program with the same status: an
// unrecovered panic, a fatal runtime error (a concurrent map write, out
// of memory) or SIGQUIT/SIGABRT all exit 2. So a proxy that crashes stays
// down until someone starts it by hand, and the journal shows the status
// the README says means "fix the variable". Here the crash is SIGQUIT, the
// runtime's own crash path, under the environment the unit gives.
func TestAttackCrashExitsWithTheConfigErrorStatus(t *testing.T) {
	unit := string(readBytes(t, unitFile))
	prevent := map[int]bool{}
	env := []string{"PATH=/usr/bin:/bin"}
	for _, line := range strings.Split(unit, "\n") {
		key, value, _ := strings.Cut(strings.TrimSpace(line), "=")
		switch key {
		case "RestartPreventExitStatus":
			for _, f := range strings.Fields(value) {
				var n int
				if _, err := fmt.Sscan(f, &n); err == nil {
					prevent[n] = true
				}
			}
		case "Environment":
			env = append(env, strings.Fields(strings.Trim(value, `"`))...)
		}
	}
	if len(prevent) == 0 {
		t.Skip("the unit restarts on every exit status")
	}
	up := startUpstream(t)
	bin := buildBinary(t)
	cmd := exec.Command("sh", "-c", `ulimit -c 0 && exec "$0"`, bin) // a crash leaves no core file here
	cmd.Env = append(env, "DNS_LISTEN=127.0.0.1:0", "DNS_METRICS_ADDR=off", "DNS_UPSTREAM="+up.Addr())
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	listening := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "msg=listening") {
				close(listening)
				break
			}
		}
		io.Copy(io.Discard, stderr) // the crash's goroutine dump
		cmd.Wait()
		close(exited)
	}()
	select {
	case <-listening:
	case <-exited:
		t.Fatalf("the binary ended before listening: %v", cmd.ProcessState)
	case <-time.After(20 * time.Second):
		t.Fatal("the binary did not start within 20s")
	}
	if err := cmd.Process.Signal(syscall.SIGQUIT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the binary did not end within 10s of SIGQUIT")
	}
	if st := cmd.ProcessState; st.Exited() && prevent[st.ExitCode()] {
		t.Fatalf("a crash ends the proxy with %v, which the unit's RestartPreventExitStatus takes for a configuration error: systemd would leave it down", st)
	}
}

// A host name in an address variable is resolved once at start-up, and a
// failed lookup stops start-up with exit 2, the status of a bad value,
// which the unit never restarts (RestartPreventExitStatus=2). But a
// resolver that answers SERVFAIL or times out says nothing of the value:
// at boot the resolver is often not reachable yet (network-online.target
// does not wait for it). The name is fine, the next start would resolve
// it, and the proxy stays down until someone starts it by hand. Here the
// resolver is a fake one on loopback answering SERVFAIL.
// The same holds for any entry of a list of upstreams (before a review of
// the fix, only a lone upstream exited 1).
func TestAttackTransientLookupFailureExitsAsConfigError(t *testing.T) {
	for _, list := range []bool{false, true} {
		t.Run(map[bool]string{false: "a lone upstream", true: "the second of a list"}[list], func(t *testing.T) {
			resolver := startUpstream(t)
			resolver.SetMode(fakeupstream.ServFail)
			saved := net.DefaultResolver
			net.DefaultResolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, resolver.Addr()) // never the system's resolver
			}}
			t.Cleanup(func() { net.DefaultResolver = saved })
			up := startUpstream(t)
			_, port, _ := net.SplitHostPort(up.Addr())
			upstreams := "upstream.dnsproxi.test.:" + port
			if list {
				upstreams = startUpstream(t).Addr() + "," + upstreams
			}
			setEnv(t, map[string]string{"DNS_LISTEN": "127.0.0.1:0", "DNS_METRICS_ADDR": "off", "DNS_UPSTREAM": upstreams})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var logs syncBuffer
			exit := make(chan int, 1)
			go func() { exit <- run(ctx, nil, io.Discard, &logs, func(*app) { cancel() }) }()
			select {
			case code := <-exit:
				if resolver.Total() == 0 {
					t.Fatalf("the lookup never reached the fake resolver (exit %d): %s", code, logs.String())
				}
				if code == 2 {
					t.Fatalf("a lookup answered SERVFAIL ends start-up with exit 2, the status of a bad value that is never restarted: %s", strings.TrimSpace(logs.String()))
				}
			case <-time.After(20 * time.Second):
				t.Fatal("run did not return")
			}
		})
	}
}

// The unit's ProcSubset=pid hides /proc/sys, where Go's net package reads
// net.core.somaxconn for the backlog of every TCP listener it opens; without
// it Go falls back to 128. Under the unit, DNS over TCP and the metrics
// address queue 128 connections, not the system's 4096: a burst of 2,000
// TCP queries (clients sent to TCP by truncation or slip) had 153 to 855
// of them wait over 900 ms for a SYN retransmission, p99 1.06-1.46 s,
// against none and 0.47-0.82 s with /proc whole. The test runs the binary
// in a mount namespace whose /proc is mounted as the unit mounts it.
func TestAttackUnitProcSubsetShrinksTheTCPBacklog(t *testing.T) {
	unit := string(readBytes(t, unitFile))
	subset := regexp.MustCompile(`(?m)^ProcSubset=pid\s*$`).MatchString(unit)
	want, err := os.ReadFile("/proc/sys/net/core/somaxconn")
	if err != nil {
		t.Skip("no /proc/sys/net/core/somaxconn")
	}
	ss, err := exec.LookPath("ss")
	if err != nil {
		t.Skip("no ss")
	}
	up := startUpstream(t)
	bin := buildBinary(t)
	script := `exec "$0"`
	if subset {
		script = `mount -t proc -o subset=pid proc /proc && exec "$0"`
		if out, err := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t proc -o subset=pid proc /proc").CombinedOutput(); err != nil {
			t.Skipf("cannot mount /proc as ProcSubset=pid does (needs root and Linux 5.8): %v %s", err, out)
		}
	}
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", script, bin)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "DNS_LISTEN=127.0.0.1:0", "DNS_METRICS_ADDR=off", "DNS_UPSTREAM=" + up.Addr()}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	addrs := make(chan string, 1)
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		re := regexp.MustCompile(`msg=listening listen=(\S+)`)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addrs <- m[1]
			}
		}
		cmd.Wait()
	}()
	var addr string
	select {
	case addr = <-addrs:
	case <-time.After(20 * time.Second):
		t.Fatal("the binary did not start within 20s")
	}
	_, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command(ss, "-Hlnt", "sport = :"+port).Output()
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(out)) // State Recv-Q Send-Q(the backlog) Local Peer
	if len(f) < 3 {
		t.Fatalf("ss: %q", out)
	}
	if got, want := f[2], strings.TrimSpace(string(want)); got != want {
		t.Fatalf("under the unit's /proc (ProcSubset=pid: %v) the DNS TCP listener's backlog is %s; want net.core.somaxconn, %s", subset, got, want)
	}
}

// The same with stderr stalled from the start (a journal hung at boot):
// the proxy binds and answers, but run writes its "listening" line (and
// the start-up warnings) straight to stderr before it reaches the signal
// loop, so SIGTERM and SIGHUP are never acted on: no graceful drain, only
// systemd's SIGKILL 45 s later.
func TestAttackStderrStalledAtStartIgnoresSIGTERM(t *testing.T) {
	up := startUpstream(t)
	const listen = "127.0.0.1:26150" // a fixed port of this test's range: ready is never called
	setEnv(t, map[string]string{"DNS_LISTEN": listen, "DNS_UPSTREAM": up.Addr(), "DNS_METRICS_ADDR": "off"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stderr := &stallWriter{}
	stderr.stall()
	t.Cleanup(stderr.release) // lets run finish once the test has judged it
	exit := make(chan int, 1)
	go func() { exit <- run(ctx, nil, io.Discard, stderr, nil) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if r, err := tryAsk("udp", listen, query("www.example.com", dns.TypeA), 200*time.Millisecond); err == nil && r.Rcode == dns.RcodeSuccess {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the proxy did not answer within 10s")
		}
	}
	cancel() // SIGTERM
	limit := asyncLogStopWait + queryLogStopWait + 5*time.Second
	select {
	case code := <-exit:
		if code != 0 {
			t.Fatalf("exit %d, want 0", code)
		}
	case <-time.After(limit):
		t.Fatalf("run did not return within %v of SIGTERM, stderr stalled since start-up; want exit 0", limit)
	}
}

// POST /cache/flush logs its line straight to stderr, before it answers:
// with stderr stalled the cache is emptied, the curl that asked never
// hears so, and the handler holds one of the metrics address's 64 places
// for good (the server's write timeout cannot free a handler stuck before
// it writes).
func TestAttackStalledStderrHoldsTheFlush(t *testing.T) {
	up := startUpstream(t)
	cfg := withCache(testConfig(up.Addr()))
	cfg.MetricsAddr = "127.0.0.1:0"
	stderr := &stallWriter{}
	a, err := newApp(cfg, guard.RealClock{}, slog.New(slog.NewTextHandler(stderr, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stderr.release() // before the shutdown, which logs too
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.shutdown(ctx)
	})
	ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA))
	stderr.stall()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Post(strings.TrimSuffix(a.metricsURL(), "/metrics")+flushPath, "text/plain", nil)
	if err != nil {
		t.Fatalf("POST %s with stderr stalled: %v; want the answer", flushPath, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %s", flushPath, resp.Status)
	}
}
