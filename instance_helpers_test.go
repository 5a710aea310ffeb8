package main

// Helpers for tests that run the real dnsproxi binary: a process with its
// addresses read from its start-up line, its /metrics read as samples, and
// a paced load of queries with names of their own.

import (
	"bufio"
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
