package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/redisproc"
)

// The outbound limit shared by a fleet on Redis, tested as it runs: three
// real dnsproxi processes, built once here, in front of one fake upstream,
// on a redis-server this test starts. The contract is scaled down to
// 300 queries a second (burst 30) so that each case takes a few seconds:
// each instance is offered three times its third, so the fleet is offered
// three times the contract.
const (
	fleetRate  = 300.0
	fleetBurst = 30
	fleetSize  = 3
)

func TestOutboundFleet(t *testing.T) {
	bin := buildBinary(t)
	t.Run("shared", func(t *testing.T) { testFleetShared(t, bin) })
	t.Run("redis killed", func(t *testing.T) { testFleetRedisKilled(t, bin) })
	t.Run("redis stopped", func(t *testing.T) { testFleetRedisStopped(t, bin) })
	t.Run("redis down at start", func(t *testing.T) { testFleetStartsLocal(t, bin) })
	t.Run("bad values", func(t *testing.T) { testOutboundBadValues(t, bin) })
}

// On one Redis the upstream receives the fleet's contract, not three times
// it: at most rate × time + burst over the whole run, since the shared
// bucket never grants more than it holds, and each instance sees the other
// two. The page still passes promtool.
func testFleetShared(t *testing.T, bin string) {
	r := startRedisProc(t)
	up := startUpstream(t)
	start := time.Now()
	fleet := startFleet(t, bin, up.Addr(), r.URL(), "shared", nil)
	for _, p := range fleet {
		p.waitMetric(t, `dnsproxi_upstream_ratelimit_mode{mode="shared"}`, 1)
		p.waitMetric(t, "dnsproxi_upstream_ratelimit_fleet_instances", fleetSize)
	}
	const span = 3 * time.Second
	loads := make([]*offered, len(fleet))
	for i, p := range fleet {
		loads[i] = offer(t, p.addr, i, 3*fleetRate/fleetSize, span)
	}
	for _, l := range loads {
		l.wait(t)
	}
	total, elapsed := up.Total(), time.Since(start).Seconds()
	bound := fleetRate*elapsed + fleetBurst
	limited := 0
	for i, p := range fleet {
		page := p.scrape(t)
		limited += page.outcome("upstream_limited")
		t.Logf("instance %d: %s; %d upstream_limited", i, loads[i], page.outcome("upstream_limited"))
		if page[`dnsproxi_upstream_ratelimit_mode{mode="shared"}`] != 1 {
			t.Errorf("instance %d left shared mode:\n%s", i, p.log())
		}
	}
	t.Logf("upstream received %d in %.2f s: %.2f × the contract (bound rate × time + burst = %.0f)", total, elapsed, float64(total)/(fleetRate*elapsed), bound)
	if float64(total) > bound {
		t.Errorf("the upstream received %d, over rate × time + burst = %.0f", total, bound)
	}
	if float64(total) < 0.6*fleetRate*span.Seconds() {
		t.Errorf("the upstream received %d in a %v offer of 3 × the contract: the fleet refused far more than its excess", total, span)
	}
	if limited == 0 {
		t.Error("no query was counted upstream_limited")
	}
	promtool := tool(t, "promtool", "prometheus")
	if out, err := runTool(t, fleet[0].page(t), promtool, "check", "metrics"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// Redis killed mid-run: each instance switches once to a local bucket of a
// third of the rate, and says so once; while Redis is dead the upstream
// receives at most 1.1 × the rate, and still about its third from each.
// Redis restarted: each returns to shared mode by itself.
func testFleetRedisKilled(t *testing.T, bin string) {
	r := startRedisProc(t)
	up := startUpstream(t)
	fleet := startFleet(t, bin, up.Addr(), r.URL(), "killed", nil)
	for _, p := range fleet {
		p.waitMetric(t, "dnsproxi_upstream_ratelimit_fleet_instances", fleetSize)
	}
	stop := make(chan struct{})
	var loads []*offered
	for i, p := range fleet {
		loads = append(loads, offerUntil(t, p.addr, i, 3*fleetRate/fleetSize, stop))
	}
	defer func() {
		close(stop)
		for _, l := range loads {
			l.wait(t)
		}
	}()

	r.Kill()
	failed := make([]float64, len(fleet))
	for i, p := range fleet {
		p.waitMetric(t, `dnsproxi_upstream_ratelimit_mode{mode="local"}`, 1)
		page := p.scrape(t)
		failed[i] = page.redisFailures()
	}
	from, fromTime := up.Total(), time.Now()
	// At least a second of local mode, by the instances' own clocks: each
	// checks Redis once a second, so two more failed checks each.
	for i, p := range fleet {
		p.waitFor(t, "two more failed Redis checks", func(s scrapePage) bool { return s.redisFailures() >= failed[i]+2 })
	}
	got, span := up.Total()-from, time.Since(fromTime).Seconds()
	t.Logf("Redis dead: the upstream received %d in %.2f s: %.2f × the rate", got, span, float64(got)/(fleetRate*span))
	if float64(got) > 1.1*fleetRate*span {
		t.Errorf("with Redis dead the upstream received %d in %.2f s, over 1.1 × rate × time = %.0f", got, span, 1.1*fleetRate*span)
	}
	if float64(got) < 0.6*fleetRate*span {
		t.Errorf("with Redis dead the upstream received %d in %.2f s: the local shares refused more than the excess", got, span)
	}

	if err := r.Restart(); err != nil {
		t.Fatal(err)
	}
	for i, p := range fleet {
		p.waitMetric(t, `dnsproxi_upstream_ratelimit_mode{mode="shared"}`, 1)
		if n := p.switchLines("local"); n != 1 {
			t.Errorf("instance %d logged %d switches to local mode, want 1:\n%s", i, n, p.log())
		}
		if strings.Count(p.log(), "rate=100") < 1 {
			t.Errorf("instance %d did not log its share of 100/s:\n%s", i, p.log())
		}
	}
}

// Redis stopped (connections accepted, nothing answered): queries are
// answered while the instances' calls to Redis hang, then each switches to
// its local share; Redis continued, shared mode returns. The Redis timeout
// is the largest allowed, 1 s, so that a query waiting on Redis would be
// answered only after the instance had counted the call's timeout.
func testFleetRedisStopped(t *testing.T, bin string) {
	r := startRedisProc(t)
	up := startUpstream(t)
	fleet := startFleet(t, bin, up.Addr(), r.URL(), "stopped", map[string]string{"DNS_UPSTREAM_RATE_LIMIT_REDIS_TIMEOUT": "1s"})
	for _, p := range fleet {
		p.waitMetric(t, "dnsproxi_upstream_ratelimit_fleet_instances", fleetSize)
	}
	stop := make(chan struct{})
	var loads []*offered
	for i, p := range fleet {
		loads = append(loads, offerUntil(t, p.addr, i, 3*fleetRate/fleetSize, stop))
	}
	defer func() {
		close(stop)
		for _, l := range loads {
			l.wait(t)
		}
	}()

	timeouts := make([]float64, len(fleet))
	for i, p := range fleet {
		timeouts[i] = p.scrape(t)[`dnsproxi_upstream_ratelimit_redis_calls_total{result="timeout"}`]
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	defer r.Continue()
	for i, p := range fleet {
		// The load spends what the lease holds; then every query is one
		// that Redis would have to serve.
		p.waitFor(t, "the lease spent", func(s scrapePage) bool { return s["dnsproxi_upstream_ratelimit_lease_tokens"] == 0 })
		for k := range 20 {
			m := query(fmt.Sprintf("stopped-%d-%d.fleet.test", i, k), dns.TypeA)
			if _, err := tryAsk("udp", p.addr, m, 3*time.Second); err != nil {
				t.Fatalf("instance %d, query %d with Redis stopped: %v", i, k, err)
			}
		}
		if got := p.scrape(t)[`dnsproxi_upstream_ratelimit_redis_calls_total{result="timeout"}`]; got != timeouts[i] {
			t.Errorf("instance %d counted %v Redis timeouts before its queries were answered: they waited on Redis", i, got-timeouts[i])
		}
	}
	for i, p := range fleet {
		p.waitMetric(t, `dnsproxi_upstream_ratelimit_mode{mode="local"}`, 1)
		if got := p.scrape(t)[`dnsproxi_upstream_ratelimit_redis_calls_total{result="timeout"}`]; got <= timeouts[i] {
			t.Errorf("instance %d is local without a Redis timeout counted", i)
		}
	}
	if err := r.Continue(); err != nil {
		t.Fatal(err)
	}
	for _, p := range fleet {
		p.waitMetric(t, `dnsproxi_upstream_ratelimit_mode{mode="shared"}`, 1)
	}
}

// A Redis that does not answer at start-up is no start-up error: the
// instance starts with its fallback, in local mode, and says so.
func testFleetStartsLocal(t *testing.T, bin string) {
	up := startUpstream(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nobody := ln.Addr().String()
	ln.Close()
	p := startInstance(t, bin, map[string]string{
		"DNS_UPSTREAM": up.Addr(), "DNS_UPSTREAM_RATE_LIMIT": "300,30",
		"DNS_UPSTREAM_RATE_LIMIT_REDIS":    "redis://u:s3cret@" + nobody + "/0",
		"DNS_UPSTREAM_RATE_LIMIT_FALLBACK": "50",
	})
	p.waitMetric(t, `dnsproxi_upstream_ratelimit_mode{mode="local"}`, 1)
	if n := p.switchLines("local"); n != 1 || !strings.Contains(p.log(), "rate=50") {
		t.Errorf("the start in local mode at the fallback rate was logged %d times:\n%s", n, p.log())
	}
	if strings.Contains(p.log(), "s3cret") {
		t.Errorf("the log shows the password:\n%s", p.log())
	}
	if r := ask(t, "udp", p.addr, query("www.example.com", dns.TypeA)); r.Rcode != dns.RcodeSuccess {
		t.Errorf("local mode: %s, want NOERROR", rcodeName(r))
	}
}

// A bad value stops start-up with one line naming the variable, the
// password redacted, and exit code 2.
func testOutboundBadValues(t *testing.T, bin string) {
	const url = "redis://u:s3cret@127.0.0.1:6379/0"
	tests := []struct {
		name string
		env  map[string]string
		key  string
	}{
		{"url does not parse", map[string]string{"DNS_UPSTREAM_RATE_LIMIT": "300", "DNS_UPSTREAM_RATE_LIMIT_REDIS": "redis://u:s3cret@[::1"}, "DNS_UPSTREAM_RATE_LIMIT_REDIS"},
		{"unknown scheme", map[string]string{"DNS_UPSTREAM_RATE_LIMIT": "300", "DNS_UPSTREAM_RATE_LIMIT_REDIS": "http://u:s3cret@127.0.0.1:6379/0"}, "DNS_UPSTREAM_RATE_LIMIT_REDIS"},
		{"password alone", map[string]string{"DNS_UPSTREAM_RATE_LIMIT": "300", "DNS_UPSTREAM_RATE_LIMIT_REDIS": "redis://s3cret@127.0.0.1:6379/db"}, "DNS_UPSTREAM_RATE_LIMIT_REDIS"},
		{"redis without the rate", map[string]string{"DNS_UPSTREAM_RATE_LIMIT_REDIS": url}, "DNS_UPSTREAM_RATE_LIMIT_REDIS"},
		{"timeout 0", map[string]string{"DNS_UPSTREAM_RATE_LIMIT": "300", "DNS_UPSTREAM_RATE_LIMIT_REDIS": url, "DNS_UPSTREAM_RATE_LIMIT_REDIS_TIMEOUT": "0"}, "DNS_UPSTREAM_RATE_LIMIT_REDIS_TIMEOUT"},
		{"fallback over the rate", map[string]string{"DNS_UPSTREAM_RATE_LIMIT": "300", "DNS_UPSTREAM_RATE_LIMIT_REDIS": url, "DNS_UPSTREAM_RATE_LIMIT_FALLBACK": "301"}, "DNS_UPSTREAM_RATE_LIMIT_FALLBACK"},
		{"key with braces", map[string]string{"DNS_UPSTREAM_RATE_LIMIT": "300", "DNS_UPSTREAM_RATE_LIMIT_REDIS": url, "DNS_UPSTREAM_RATE_LIMIT_KEY": "{a}"}, "DNS_UPSTREAM_RATE_LIMIT_KEY"},
		{"rate not a number", map[string]string{"DNS_UPSTREAM_RATE_LIMIT": "fast"}, "DNS_UPSTREAM_RATE_LIMIT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin)
			cmd.Env = append(cleanEnv(), "DNS_LISTEN=127.0.0.1:0", "DNS_UPSTREAM=127.0.0.1:5300", "DNS_METRICS_ADDR=off")
			for k, v := range tt.env {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err := cmd.Run()
			code := cmd.ProcessState.ExitCode()
			out := stderr.String()
			lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
			if code != 2 || len(lines) != 1 || !strings.HasPrefix(lines[0], "dnsproxi: "+tt.key+"=") {
				t.Fatalf("exit %d (%v), stderr %q; want exit 2 and one line naming %s", code, err, out, tt.key)
			}
			if strings.Contains(out, "s3cret") {
				t.Errorf("the error shows the password: %q", out)
			}
			t.Logf("%s", lines[0])
		})
	}
}

// cleanEnv is the test's environment without any DNS_ variable.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DNS_") {
			env = append(env, kv)
		}
	}
	return env
}

// startRedisProc starts a redis-server for the test, killed at its end.
func startRedisProc(t testing.TB) *redisproc.Server {
	t.Helper()
	r, err := redisproc.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Kill)
	return r
}

// startFleet starts fleetSize instances in front of upstream sharing the
// contract on the Redis at url, under a key of the test's own, with extra
// variables.
func startFleet(t *testing.T, bin, upstream, url, key string, extra map[string]string) []*instance {
	t.Helper()
	var fleet []*instance
	for range fleetSize {
		env := map[string]string{
			"DNS_UPSTREAM":                  upstream,
			"DNS_UPSTREAM_RATE_LIMIT":       fmt.Sprintf("%g,%d", fleetRate, fleetBurst),
			"DNS_UPSTREAM_RATE_LIMIT_REDIS": url,
			"DNS_UPSTREAM_RATE_LIMIT_KEY":   "test-" + key,
		}
		for k, v := range extra {
			env[k] = v
		}
		fleet = append(fleet, startInstance(t, bin, env))
	}
	return fleet
}

// instance is one running dnsproxi process.
type instance struct {
	cmd     *exec.Cmd
	addr    string // DNS host:port
	metrics string // /metrics URL
	done    chan struct{}
	stderr  syncBuffer
}

// listeningLine reads the addresses from the start-up log line.
var listeningLine = regexp.MustCompile(`msg=listening listen=(\S+) .*metrics=(\S+)`)

// startInstance runs bin with env on free loopback ports and waits (at most
// 10 s) until it listens; the test's end stops it.
func startInstance(t *testing.T, bin string, env map[string]string) *instance {
	t.Helper()
	p := &instance{done: make(chan struct{})}
	p.cmd = exec.Command(bin)
	p.cmd.Env = append(cleanEnv(), "DNS_LISTEN=127.0.0.1:0", "DNS_METRICS_ADDR=127.0.0.1:0")
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	pipe, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	listening := make(chan []string, 1)
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			line := sc.Text()
			p.stderr.Write([]byte(line + "\n"))
			if m := listeningLine.FindStringSubmatch(line); m != nil {
				listening <- m
			}
		}
		p.cmd.Wait()
	}()
	t.Cleanup(func() {
		p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
			t.Errorf("dnsproxi did not stop within 10 s:\n%s", p.log())
		}
	})
	select {
	case m := <-listening:
		p.addr, p.metrics = m[1], m[2]
	case <-p.done:
		t.Fatalf("dnsproxi exited at start:\n%s", p.log())
	case <-time.After(10 * time.Second):
		t.Fatalf("dnsproxi did not start listening within 10 s:\n%s", p.log())
	}
	return p
}

func (p *instance) log() string { return p.stderr.String() }

// switchLines counts the log lines saying the outbound limit went to mode.
func (p *instance) switchLines(mode string) int {
	n := 0
	for _, line := range strings.Split(p.log(), "\n") {
		if strings.Contains(line, `msg="upstream rate limit`) && strings.Contains(line, " mode="+mode+" ") {
			n++
		}
	}
	return n
}

// page returns the instance's /metrics page.
func (p *instance) page(t *testing.T) string {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(p.metrics)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		b.WriteString(sc.Text() + "\n")
	}
	return b.String()
}

// scrapePage is one reading of /metrics: "name{labels}" → value.
type scrapePage map[string]float64

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s+(\S+)$`)

func (p *instance) scrape(t *testing.T) scrapePage {
	t.Helper()
	s := scrapePage{}
	for _, line := range strings.Split(p.page(t), "\n") {
		if m := sampleLine.FindStringSubmatch(line); m != nil {
			if v, err := strconv.ParseFloat(m[2], 64); err == nil {
				s[m[1]] = v
			}
		}
	}
	return s
}

// outcome sums dnsproxi_queries_total over query types for one outcome.
func (s scrapePage) outcome(o string) int {
	total := 0.0
	for k, v := range s {
		if strings.HasPrefix(k, "dnsproxi_queries_total{") && strings.Contains(k, `outcome="`+o+`"`) {
			total += v
		}
	}
	return int(total)
}

// redisFailures is the Redis calls that failed or timed out.
func (s scrapePage) redisFailures() float64 {
	return s[`dnsproxi_upstream_ratelimit_redis_calls_total{result="error"}`] +
		s[`dnsproxi_upstream_ratelimit_redis_calls_total{result="timeout"}`]
}

// waitFor scrapes until cond holds, failing after 10 s.
func (p *instance) waitFor(t *testing.T, what string, cond func(scrapePage) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := p.scrape(t)
		if cond(s) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s at %s:\n%s", what, p.addr, p.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitMetric waits until the sample name reads want.
func (p *instance) waitMetric(t *testing.T, name string, want float64) {
	t.Helper()
	p.waitFor(t, fmt.Sprintf("%s = %v", name, want), func(s scrapePage) bool { return s[name] == want })
}

// offered is a paced load on one instance and what came back.
type offered struct {
	sent, noError, refused, other atomic.Int64
	done                          chan struct{}
}

func (o *offered) String() string {
	return fmt.Sprintf("%d sent, %d NOERROR, %d REFUSED, %d other", o.sent.Load(), o.noError.Load(), o.refused.Load(), o.other.Load())
}

// wait waits for the load to end and its answers to come in: every query
// answered, failing after 10 s.
func (o *offered) wait(t *testing.T) {
	t.Helper()
	select {
	case <-o.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the load did not end: %s", o)
	}
	if got := o.noError.Load() + o.refused.Load() + o.other.Load(); got != o.sent.Load() {
		t.Errorf("%s: %d unanswered", o, o.sent.Load()-got)
	}
}

// offer sends rate queries a second to addr for span, each for a name of
// its own (nothing coalesces), from one UDP socket.
func offer(t *testing.T, addr string, id int, rate float64, span time.Duration) *offered {
	stop := make(chan struct{})
	time.AfterFunc(span, func() { close(stop) })
	return offerUntil(t, addr, id, rate, stop)
}

// offerUntil is offer until stop is closed (10 s at most).
func offerUntil(t *testing.T, addr string, id int, rate float64, stop <-chan struct{}) *offered {
	t.Helper()
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	o := &offered{done: make(chan struct{})}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		buf := make([]byte, 1500)
		m := new(dns.Msg)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			if m.Unpack(buf[:n]) != nil {
				o.other.Add(1)
				continue
			}
			switch m.Rcode {
			case dns.RcodeSuccess:
				o.noError.Add(1)
			case dns.RcodeRefused:
				o.refused.Add(1)
			default:
				o.other.Add(1)
			}
		}
	}()
	go func() {
		defer close(o.done)
		start := time.Now()
		limit := time.After(10 * time.Second)
		for n := 0; ; {
			select {
			case <-stop:
			case <-limit:
			default:
				for due := int(time.Since(start).Seconds() * rate); n < due; n++ {
					m := query(fmt.Sprintf("q%d-%d.fleet.test", n, id), dns.TypeA)
					m.Id = uint16(n)
					b, _ := m.Pack()
					if _, err := c.Write(b); err == nil {
						o.sent.Add(1)
					}
				}
				time.Sleep(2 * time.Millisecond)
				continue
			}
			break
		}
		// The answers still on their way: every one, or a second at most.
		deadline := time.Now().Add(time.Second)
		for o.noError.Load()+o.refused.Load()+o.other.Load() < o.sent.Load() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		c.Close()
		<-readerDone
	}()
	return o
}
