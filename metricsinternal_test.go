package main

import (
	"context"
	"log/slog"
	"net"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
	"dnsproxi/metrics"
	"dnsproxi/pool"
	"dnsproxi/upstream"
)

// internalSeries are the counts parts of the proxy keep of themselves that
// no outcome shows: served from the start, at zero.
var internalSeries = []string{"dnsproxi_log_dropped_total", "dnsproxi_late_hedges_total", "dnsproxi_tcp_forced_closes_total"}

// metricValue returns the value of the unlabelled series name on page, and
// whether page has it.
func metricValue(page, name string) (float64, bool) {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(page)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	return v, err == nil
}

// Each count is a counter on /metrics from the start, at zero, with the
// hedges on or off: a dashboard or an alert finds it before the first
// event.
func TestInternalCountsStartAtZero(t *testing.T) {
	first, second := startUpstream(t), startUpstream(t)
	tests := []struct {
		name string
		cfg  Config
	}{
		{"one upstream", testConfig(first.Addr())},
		{"hedging", func() Config {
			cfg := failoverConfig(first.Addr(), second.Addr())
			cfg.UpstreamHedge = Hedge{After: 100 * time.Millisecond, Given: true}
			return cfg
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.MetricsAddr = "127.0.0.1:0"
			page := scrape(t, startProxy(t, tt.cfg, guard.RealClock{}))
			for _, name := range internalSeries {
				if !strings.Contains(page, "\n# TYPE "+name+" counter\n") {
					t.Errorf("/metrics has no counter %s", name)
				}
				if v, ok := metricValue(page, name); !ok || v != 0 {
					t.Errorf("%s = %v (present: %v), want 0 from the start", name, v, ok)
				}
			}
		})
	}
}

// stallingWriter is a stderr that takes every line until armed, then
// stalls every write until release is closed, as a pipe whose reader
// stopped does; stalled is closed by the first write that stalls.
type stallingWriter struct {
	armed   atomic.Bool
	once    sync.Once
	stalled chan struct{}
	release chan struct{}
}

func (w *stallingWriter) Write(p []byte) (int, error) {
	if w.armed.Load() {
		w.once.Do(func() { close(w.stalled) })
		<-w.release
	}
	return len(p), nil
}

// A stderr that stalls drops the log lines beyond the queue of 256 rather
// than holding the goroutine that logs; /metrics counts them. One line
// holds the writer in its write; of 300 more, 256 wait in the queue and 44
// are dropped.
func TestStalledStderrDropsAreOnMetrics(t *testing.T) {
	up := startUpstream(t)
	cfg := testConfig(up.Addr())
	cfg.MetricsAddr = "127.0.0.1:0"
	w := &stallingWriter{stalled: make(chan struct{}), release: make(chan struct{})}
	a, err := newApp(cfg, guard.RealClock{}, slog.New(slog.NewTextHandler(w, nil)))
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
	t.Cleanup(func() { close(w.release) }) // first: shutdown then finds stderr flowing
	w.armed.Store(true)
	a.reopen() // SIGHUP with nothing to reopen: one line, through the queue
	select {
	case <-w.stalled:
	case <-time.After(5 * time.Second):
		t.Fatal("the log's writer never reached stderr")
	}
	const more = 300
	for range more {
		a.reopen()
	}
	want := float64(more - asyncLogQueue)
	if v, ok := metricValue(scrape(t, a), "dnsproxi_log_dropped_total"); !ok || v != want {
		t.Fatalf("dnsproxi_log_dropped_total = %v (present: %v), want %v: %d lines logged while stderr stalled, %d fit the queue",
			v, ok, want, more, asyncLogQueue)
	}
}

// Connections the server closes all at once (each sent a bad length), by
// clients that never close their side: 64 closes linger, a second at
// most, and the ones beyond are closed at once, which /metrics counts. A
// round is 100 connections opened, then their bad lengths written in one
// quick loop: their closes fall well within the second. A machine so
// loaded that they did not gets another round, at most 5.
func TestForcedTCPClosesAreOnMetrics(t *testing.T) {
	up := startUpstream(t)
	cfg := testConfig(up.Addr())
	cfg.MetricsAddr = "127.0.0.1:0"
	cfg.TCPMaxConns = 200
	a := startProxy(t, cfg, guard.RealClock{})
	if v, ok := metricValue(scrape(t, a), "dnsproxi_tcp_forced_closes_total"); !ok || v != 0 {
		t.Fatalf("dnsproxi_tcp_forced_closes_total = %v (present: %v) before any connection, want 0", v, ok)
	}
	const perRound, rounds = 100, 5
	malformed := regexp.MustCompile(`(?m)^dnsproxi_server_dropped_total\{reason="malformed"\} (\S+)$`)
	for round := 1; round <= rounds; round++ {
		conns := make([]net.Conn, 0, perRound)
		for i := range perRound {
			c, err := net.DialTimeout("tcp", a.addr(), 5*time.Second)
			if err != nil {
				t.Fatalf("round %d, connection %d: %v", round, i, err)
			}
			defer c.Close()
			conns = append(conns, c)
		}
		for _, c := range conns {
			c.Write([]byte{0, 0}) // a length below a header's: the server closes the connection
		}
		waitFor(t, "the server to close every connection of the round", func() bool {
			m := malformed.FindStringSubmatch(scrape(t, a))
			return m != nil && m[1] == strconv.Itoa(round*perRound)
		})
		if v, _ := metricValue(scrape(t, a), "dnsproxi_tcp_forced_closes_total"); v > 0 {
			if v > float64(round*(perRound-64)) {
				t.Fatalf("dnsproxi_tcp_forced_closes_total = %v after %d rounds of %d closes: more than %d beyond 64 lingering",
					v, round, perRound, round*(perRound-64))
			}
			return
		}
		for _, c := range conns {
			c.Close() // their lingering closes end: the next round starts from none
		}
	}
	t.Fatalf("%d rounds of %d connections closed at once: dnsproxi_tcp_forced_closes_total has not moved (or is absent)", rounds, perRound)
}

// silentForwarder is an upstream that never answers: it keeps each
// query's done, to be told at the test's end.
type silentForwarder struct {
	mu   sync.Mutex
	done []upstream.Result
}

func (f *silentForwarder) ForwardUntil(query []byte, _ string, _ time.Time, done upstream.Result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.done = append(f.done, done)
}

// end tells every query sent that it failed.
func (f *silentForwarder) end() {
	f.mu.Lock()
	done := f.done
	f.done = nil
	f.mu.Unlock()
	for _, d := range done {
		d(nil, nil, upstream.ErrClosed)
	}
}

// A hedge the hedging goroutine reaches only after its query's deadline
// (the process stalled) is not sent, and /metrics counts it. The pool runs
// on a manual clock: the hedger waits for the hedge due at 100ms, and the
// clock jumps to the deadline, a second on, as a stalled process finds it.
func TestLateHedgesAreOnMetrics(t *testing.T) {
	clock := guard.NewManualClock(time.Unix(1e9, 0))
	first, second := &silentForwarder{}, &silentForwarder{}
	p, err := pool.New(pool.Config{
		Members: []pool.Member{{Name: "first", Upstream: first}, {Name: "second", Upstream: second}},
		Timeout: time.Second, Hedge: 100 * time.Millisecond, Clock: clock,
		Budget: guard.NewRetryBudget(guard.RetryBudgetConfig{Ratio: 1}, clock),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	defer first.end()
	m := metrics.New()
	m.WatchInternals(internalCounts{hedges: p}.read)
	page := func() string {
		rec := httptest.NewRecorder()
		m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	if v, ok := metricValue(page(), "dnsproxi_late_hedges_total"); !ok || v != 0 {
		t.Fatalf("dnsproxi_late_hedges_total = %v (present: %v) before any query, want 0", v, ok)
	}
	x, err := p.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	q, _ := query("late.example", dns.TypeA).Pack()
	x.Forward(q, "udp", func(_, _ []byte, _ error) {})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := clock.BlockUntilWaiters(ctx, 1); err != nil {
		t.Fatal("the hedger never waited for the hedge:", err)
	}
	clock.Advance(time.Second)
	waitFor(t, "the late hedge on /metrics", func() bool {
		v, _ := metricValue(page(), "dnsproxi_late_hedges_total")
		return v == 1
	})
	second.mu.Lock()
	defer second.mu.Unlock()
	if n := len(second.done); n != 0 {
		t.Fatalf("%d hedges sent after the deadline, want none", n)
	}
}
