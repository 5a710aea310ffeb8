package main

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
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

// patientRedis gives each Redis call the largest timeout allowed, 1 s, for
// the cases whose Redis is alive or dead but never slow: at the default
// 50 ms a call slowed by a loaded machine (a -race run on two cores) is a
// switch to local mode and back that the case did not cause, and would
// count against it ("left shared mode", "2 switches to local mode").
// A killed Redis refuses at once, whatever the timeout.
var patientRedis = map[string]string{"DNS_UPSTREAM_RATE_LIMIT_REDIS_TIMEOUT": "1s"}

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
	fleet := startFleet(t, bin, up.Addr(), r.URL(), "shared", patientRedis)
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
	fleet := startFleet(t, bin, up.Addr(), r.URL(), "killed", patientRedis)
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

	// A Redis call slower than the timeout on a loaded machine may switch an
	// instance to local mode and back before the kill: count the switches
	// the kill causes, from shared mode.
	switchesBefore := make([]int, len(fleet))
	for i, p := range fleet {
		p.waitMetric(t, `dnsproxi_upstream_ratelimit_mode{mode="shared"}`, 1)
		switchesBefore[i] = p.switchLines("local")
	}
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
		if n := p.switchLines("local") - switchesBefore[i]; n != 1 {
			t.Errorf("instance %d logged %d switches to local mode after Redis was killed, want 1:\n%s", i, n, p.log())
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
