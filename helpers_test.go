package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
)

// startUpstream starts a fake upstream on loopback for the test's lifetime.
func startUpstream(t *testing.T) *fakeupstream.Server {
	t.Helper()
	up, err := fakeupstream.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	return up
}

// holdGate returns a channel a fake upstream's script waits on, and a func
// that opens it, once. The test's end opens it too, so a test that fails
// while the upstream holds a reply fails rather than hangs.
func holdGate(t *testing.T) (<-chan struct{}, func()) {
	t.Helper()
	ch := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(ch) }) }
	t.Cleanup(open)
	return ch, open
}

// testConfig is a configuration with both gates off, listening on a free
// loopback port, forwarding to upstream.
func testConfig(upstream string) Config {
	return Config{
		Listen:            "127.0.0.1:0",
		Upstream:          upstream,
		UpstreamTimeout:   500 * time.Millisecond,
		BreakerMinSamples: 20,
		BreakerWindow:     100,
		BreakerCoolOff:    time.Second,
		MetricsAddr:       "off",
		MaxInflight:       1000,
		TCPMaxConns:       100,
		TCPIdleTimeout:    10 * time.Second,
		MaxUDPSize:        1232,
		Upstream0x20:      true,
	}
}

// startProxy runs the whole proxy with cfg and clock until the test ends.
func startProxy(t *testing.T, cfg Config, clock guard.Clock) *app {
	t.Helper()
	a, err := newApp(cfg, clock, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.shutdown(ctx)
	})
	return a
}

func (a *app) addr() string { return a.server.LocalAddr().String() }

// query builds a recursive query for name and type.
func query(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	return m
}

// ask sends m to addr over network and returns the reply, or fails the test.
func ask(t *testing.T, network, addr string, m *dns.Msg) *dns.Msg {
	t.Helper()
	r, err := tryAsk(network, addr, m, 3*time.Second)
	if err != nil {
		t.Fatalf("%s query %s to %s: %v", network, m.Question[0].Name, addr, err)
	}
	return r
}

// tryAsk sends m and waits up to timeout for the reply.
func tryAsk(network, addr string, m *dns.Msg, timeout time.Duration) (*dns.Msg, error) {
	c := &dns.Client{Net: network, Timeout: timeout, UDPSize: 65535}
	r, _, err := c.Exchange(m, addr)
	return r, err
}

// sendRaw sends pkt over UDP and returns the reply's bytes, or nil if none
// came within wait.
func sendRaw(t *testing.T, addr string, pkt []byte, wait time.Duration) []byte {
	t.Helper()
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(pkt); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}

// count reads dnsproxi_queries_total{qtype,outcome}. A query is counted
// just after its answer is written, so count waits (bounded) for want and
// returns the last value it read.
func count(a *app, qtype, outcome string, want int) int {
	deadline := time.Now().Add(2 * time.Second)
	for {
		got := int(testutil.ToFloat64(a.metrics.Queries.WithLabelValues(qtype, outcome)))
		if got == want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(time.Millisecond)
	}
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func rcodeName(m *dns.Msg) string { return dns.RcodeToString[m.Rcode] }

func answerText(m *dns.Msg) string {
	var parts []string
	for _, rr := range m.Answer {
		parts = append(parts, rr.String())
	}
	return strings.Join(parts, "; ")
}
