package main

import (
	"bytes"
	"context"
	"io"
	"maps"
	"math"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dnsproxi/guard"
	"dnsproxi/metrics"
)

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// syncBuffer is a bytes.Buffer safe for the logger and the test at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// SIGTERM while a query is in flight: the query is still answered, then run returns 0.
func TestSIGTERMDrainsQueriesInFlight(t *testing.T) {
	up := startUpstream(t)
	held, release := holdGate(t)
	up.SetScript(func(req *dns.Msg, _ string) [][]byte {
		<-held
		b, _ := answerFor(req).Pack()
		return [][]byte{b}
	})
	setEnv(t, map[string]string{"DNS_LISTEN": "127.0.0.1:0", "DNS_UPSTREAM": up.Addr(), "DNS_METRICS_ADDR": "off"})

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM) // as main does
	defer stop()
	ready := make(chan *app, 1)
	exit := make(chan int, 1)
	var logs syncBuffer
	go func() { exit <- run(ctx, nil, io.Discard, &logs, func(a *app) { ready <- a }) }()
	var a *app
	select {
	case a = <-ready:
	case code := <-exit:
		t.Fatalf("run exited %d before listening: %s", code, logs.String())
	}

	answer := make(chan *dns.Msg, 1)
	go func() {
		r, _ := tryAsk("udp", a.addr(), query("www.example.com", dns.TypeA), 5*time.Second)
		answer <- r
	}()
	waitFor(t, "the query to reach the upstream", func() bool { return up.Total() == 1 })
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the shutdown to begin", func() bool { return strings.Contains(logs.String(), "shutting down") })
	release() // the upstream answers only now, after SIGTERM
	if r := <-answer; r == nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("the query in flight at SIGTERM got %v", r)
	}
	select {
	case code := <-exit:
		if code != 0 {
			t.Fatalf("exit %d, want 0", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("run did not return after draining")
	}
	if _, err := tryAsk("udp", a.addr(), query("www.example.com", dns.TypeA), 200*time.Millisecond); err == nil {
		t.Fatal("still answering after shutdown")
	}
}

func answerFor(req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	rr, _ := dns.NewRR(req.Question[0].Name + " 60 IN A 192.0.2.1")
	m.Answer = append(m.Answer, rr)
	return m
}

// The /metrics page passes Prometheus's own linter (what promtool check
// metrics runs) and shows every known combination before any query.
func TestMetricsEndpoint(t *testing.T) {
	up := startUpstream(t)
	cfg := testConfig(up.Addr())
	cfg.MetricsAddr = "127.0.0.1:0"
	cfg.BreakerThreshold = 50
	a := startProxy(t, cfg, guard.RealClock{})

	resp, err := http.Get(a.metricsURL())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	page := string(body)
	for _, want := range []string{
		`dnsproxi_queries_total{outcome="rate_limited",qtype="AAAA"} 0`,
		`dnsproxi_queries_total{outcome="breaker_open",qtype="OTHER"} 0`,
		`dnsproxi_breaker_transitions_total{from="closed",to="open",upstream="` + up.Addr() + `"} 0`,
		`dnsproxi_breaker_state{upstream="` + up.Addr() + `"} 0`,
		`dnsproxi_upstream_requests_total{result="timeout",upstream="` + up.Addr() + `"} 0`,
		`dnsproxi_upstream_socket_rotations_total{upstream="` + up.Addr() + `"} 0`,
		`dnsproxi_upstream_case_tcp_fetches_total{upstream="` + up.Addr() + `"} 0`,
		`dnsproxi_upstream_0x20{upstream="` + up.Addr() + `"} 1`,
		`dnsproxi_retries_total{reason="hedge"} 0`,
		`dnsproxi_retry_budget_exhausted_total 0`,
		`dnsproxi_queries_total{outcome="denied",qtype="A"} 0`,
		`dnsproxi_queries_total{outcome="client_limited",qtype="OTHER"} 0`,
		`dnsproxi_client_table_entries 0`,
		`dnsproxi_client_table_evictions_total 0`,
		`dnsproxi_client_overflow_total 0`,
		`dnsproxi_queries_in_flight 0`,
		`dnsproxi_request_duration_seconds_bucket`,
		`dnsproxi_upstream_duration_seconds_bucket`,
		`go_goroutines`,
		`process_resident_memory_bytes`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	problems, err := testutil.GatherAndLint(a.metrics.Registry)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	ask(t, "udp", a.addr(), query("www.example.com", dns.TypeMX))
	if got := count(a, "MX", "forwarded", 1); got != 1 {
		t.Errorf("MX forwarded = %d, want 1", got)
	}
	ask(t, "udp", a.addr(), query("www.example.com", dns.TypeNAPTR))
	if got := count(a, "OTHER", "forwarded", 1); got != 1 {
		t.Errorf("NAPTR should count as OTHER: %d", got)
	}
}

// The breaker_state gauge holds guard.State's value: its order must be the
// order metrics.States names.
func TestBreakerStateGaugeEncoding(t *testing.T) {
	for _, s := range []guard.State{guard.Closed, guard.HalfOpen, guard.Open} {
		if int(s) >= len(metrics.States) || metrics.States[int(s)] != s.String() {
			t.Errorf("guard.State %v = %d, but metrics.States says %v", s, int(s), metrics.States)
		}
	}
}

// Every configuration error stops run before anything is bound: exit 2 and
// one line on stderr naming the variable. The context is already cancelled,
// so a configuration wrongly accepted makes run return 0 at once.
func TestRunConfigErrorExit2(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"DNS_UPSTREAM": "a..b:53"}, `DNS_UPSTREAM="a..b:53": must be host:port such as 127.0.0.1:53, port 1..65535`},
		{map[string]string{"DNS_UPSTREAM_TIMEOUT": "1ns"}, `DNS_UPSTREAM_TIMEOUT="1ns": must be a duration from 10ms to 30s, such as 500ms or 2s`},
		{map[string]string{"DNS_RATE_LIMIT": "1e300"}, `DNS_RATE_LIMIT="1e300": rate must be a number of queries per second from 0.001 to 100000000, or off`},
		{map[string]string{"DNS_MAX_INFLIGHT": "9223372036854775807"}, `DNS_MAX_INFLIGHT="9223372036854775807": must be an integer from 0 to 100000`},
		{map[string]string{"DNS_MAX_UDP_SIZE": "511"}, `DNS_MAX_UDP_SIZE="511": must be an integer from 512 to 4096`},
		{map[string]string{"DNS_UPSTREAM_0X20": "maybe"}, `DNS_UPSTREAM_0X20="maybe": must be on or off (also true/false, 1/0)`},
		{map[string]string{"DNS_CLIENT_PREFIX": "33,64"}, `DNS_CLIENT_PREFIX="33,64": must be v4len,v6len: an IPv4 prefix length 0..32 and an IPv6 one 0..128, such as 32,64`},
		{map[string]string{"DNS_ALLOW": "10.0.0.0/8,300.1.1.0/24"}, `DNS_ALLOW="10.0.0.0/8,300.1.1.0/24": must be any, or a comma-separated list of CIDR prefixes or addresses (such as 192.0.2.0/24, 2001:db8::/32), local for the default networks`},
		{map[string]string{"DNS_CLIENT_EXEMPT": "10.0.0.0/8/8"}, `DNS_CLIENT_EXEMPT="10.0.0.0/8/8": must be a comma-separated list of CIDR prefixes or addresses, such as 192.0.2.0/24, 2001:db8::/32`},
		{map[string]string{"DNS_LIMIT_ACTION": "slip:0"}, `DNS_LIMIT_ACTION="slip:0": must be drop, refuse, slip or slip:N with N from 1 to 10`},
		{map[string]string{"DNS_LIMIT_ACTION": "tarpit"}, `DNS_LIMIT_ACTION="tarpit": must be drop, refuse, slip or slip:N with N from 1 to 10`},
		{map[string]string{"DNS_LISTEN": "127.0.0.1:5398", "DNS_METRICS_ADDR": "127.0.0.1:5398"},
			`DNS_METRICS_ADDR="127.0.0.1:5398": must differ from DNS_LISTEN (127.0.0.1:5398): both take TCP port 5398`},
	}
	for _, tt := range tests {
		t.Run(envString(tt.env), func(t *testing.T) {
			exitsTwo(t, tt.env, tt.want)
		})
	}
}

// maxUnanswered never overflows, whatever cap it is given.
func TestMaxUnansweredNeverOverflows(t *testing.T) {
	for _, inflight := range []int{0, 1, 1000, 100000, math.MaxInt / 2, math.MaxInt - 1, math.MaxInt} {
		got := maxUnanswered(inflight)
		if got < 1 || (inflight > 0 && got < inflight) {
			t.Errorf("maxUnanswered(%d) = %d: below the cap it must hold", inflight, got)
		}
	}
}

// SIGHUP does not stop the proxy: it logs that there is nothing to reload
// and goes on answering; run still stops cleanly afterwards.
func TestRunSIGHUPKeepsServing(t *testing.T) {
	up := startUpstream(t)
	setEnv(t, map[string]string{"DNS_LISTEN": "127.0.0.1:0", "DNS_UPSTREAM": up.Addr(), "DNS_METRICS_ADDR": "off"})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan *app, 1)
	exit := make(chan int, 1)
	var logs syncBuffer
	go func() { exit <- run(ctx, nil, io.Discard, &logs, func(a *app) { ready <- a }) }()
	var a *app
	select {
	case a = <-ready:
	case code := <-exit:
		t.Fatalf("run exited %d before listening: %s", code, logs.String())
	case <-time.After(10 * time.Second):
		t.Fatal("run did not start listening")
	}
	ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA))

	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "SIGHUP to be logged", func() bool { return strings.Contains(logs.String(), "SIGHUP") })
	select {
	case code := <-exit:
		t.Fatalf("run exited %d on SIGHUP: %s", code, logs.String())
	default:
	}
	if r := ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA)); r.Rcode != dns.RcodeSuccess {
		t.Fatalf("after SIGHUP: %s", rcodeName(r))
	}
	ask(t, "tcp", a.addr(), query("www.example.com", dns.TypeA))

	cancel()
	select {
	case code := <-exit:
		if code != 0 {
			t.Fatalf("exit %d, want 0", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("run did not return after its context ended")
	}
}

// exitsTwo runs dnsproxi with env over a loopback default (no listener is
// bound: the context is already cancelled) and wants exit code 2 and the one
// line "dnsproxi: want" on stderr.
func exitsTwo(t *testing.T, env map[string]string, want string) {
	t.Helper()
	full := map[string]string{"DNS_LISTEN": "127.0.0.1:0", "DNS_METRICS_ADDR": "off", "DNS_UPSTREAM": "127.0.0.1:5300"}
	maps.Copy(full, env)
	setEnv(t, full)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var stdout, stderr syncBuffer
	if code := run(ctx, nil, &stdout, &stderr, nil); code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	if got, line := stderr.String(), "dnsproxi: "+want+"\n"; got != line {
		t.Errorf("stderr %q\nwant   %q", got, line)
	}
}
