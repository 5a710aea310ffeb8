package main

import (
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
	"dnsproxi/pool"
)

// failoverConfig is testConfig over upstreams, in order, with the default
// retry budget (10%) and hedge (0: off unless the test sets it).
func failoverConfig(upstreams ...string) Config {
	cfg := testConfig(upstreams[0])
	for _, u := range upstreams[1:] {
		cfg.Upstream += "," + u
	}
	cfg.RetryBudget = 10
	return cfg
}

// closedPort returns a loopback address where nothing listens: a TCP
// connection there is refused at once.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// upstreamCount reads dnsproxi_upstream_requests_total{upstream,result},
// waiting (bounded) for want: an attempt is counted as it ends.
func upstreamCount(a *app, upstream, result string, want int) int {
	deadline := time.Now().Add(3 * time.Second)
	for {
		got := int(testutil.ToFloat64(a.metrics.UpstreamRequests.WithLabelValues(upstream, result)))
		if got == want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(time.Millisecond)
	}
}

// A first upstream that answers SERVFAIL or REFUSED, or fails fast, is
// retried once at the second, and the client has the second's answer.
func TestRetryAtTheNextUpstream(t *testing.T) {
	tests := []struct {
		name, network string
		first         fakeupstream.Mode // -1: a closed port
		reason        string
	}{
		{"SERVFAIL", "udp", fakeupstream.ServFail, "answer"},
		{"REFUSED", "udp", fakeupstream.Refused, "answer"},
		{"connection refused", "tcp", -1, "failure"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			second := startUpstream(t)
			first := ""
			if tt.first >= 0 {
				up := startUpstream(t)
				up.SetMode(tt.first)
				first = up.Addr()
			} else {
				first = closedPort(t)
			}
			a := startProxy(t, failoverConfig(first, second.Addr()), guard.RealClock{})
			r := ask(t, tt.network, a.addr(), query("www.example.com", dns.TypeA))
			if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
				t.Fatalf("rcode %s with %d answers, want the second upstream's answer", rcodeName(r), len(r.Answer))
			}
			if got := int(testutil.ToFloat64(a.metrics.Retries.WithLabelValues(tt.reason))); got != 1 {
				t.Fatalf("retries_total{reason=%q} %d, want 1", tt.reason, got)
			}
			if got := count(a, "A", "forwarded", 1); got != 1 {
				t.Fatalf("forwarded %d, want 1: a retried query is still one query", got)
			}
			if got := upstreamCount(a, second.Addr(), "answer", 1); got != 1 {
				t.Fatalf("the second upstream's answers %d, want 1", got)
			}
		})
	}
}

// One deadline per query: whatever retries and hedges happen, the query
// ends at DNS_UPSTREAM_TIMEOUT (and the sweeper's tick), never at a fresh
// timeout after the first attempt's. With a deadline per attempt both
// cases would end at 1.5 T. The proxy's own measure of the query (the
// request-duration histogram: from its reading to the sweeper's tick that
// found the deadline past) is what is bounded, at T + T/4: the client's
// clock adds what a loaded machine adds (under -race on two cores a
// correct answer reached the client 1.25 to 1.4 T after the query left).
// The retry and the hedge come at half T: a retry needs a tenth of T
// left, and a SERVFAIL meant for 0.8 T that a loaded machine read 100 ms
// late was reported as it was, with no retry to test.
func TestOneDeadlinePerQuery(t *testing.T) {
	const T = time.Second
	tests := []struct {
		name          string
		hedge         time.Duration
		first, second func(*fakeupstream.Server)
		name2         string
	}{
		{"a SERVFAIL at 0.5 T, retried at a dead upstream", 0,
			func(up *fakeupstream.Server) { up.SetMode(fakeupstream.ServFail); up.SetDelay(T / 2) },
			func(up *fakeupstream.Server) { up.SetMode(fakeupstream.Blackhole) }, "slow.example.com"},
		{"a hedge at 0.5 T, both upstreams dead", T / 2,
			func(up *fakeupstream.Server) { up.SetMode(fakeupstream.Blackhole) },
			func(up *fakeupstream.Server) { up.SetMode(fakeupstream.Blackhole) }, "dead.example.com"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			first, second := startUpstream(t), startUpstream(t)
			tt.first(first)
			tt.second(second)
			cfg := failoverConfig(first.Addr(), second.Addr())
			cfg.UpstreamTimeout, cfg.UpstreamHedge = T, Hedge{After: tt.hedge, Given: true}
			a := startProxy(t, cfg, guard.RealClock{})
			start := time.Now()
			r, err := tryAsk("udp", a.addr(), query(tt.name2, dns.TypeA), 5*T)
			took := time.Since(start)
			if err != nil || r.Rcode != dns.RcodeServerFailure {
				t.Fatalf("%v, %v: want SERVFAIL", r, err)
			}
			// The query is timed just after its answer is written.
			var n uint64
			var sum float64
			waitFor(t, "the query to be timed", func() bool { n, sum = requestDurations(t, a); return n == 1 })
			if d := time.Duration(sum * float64(time.Second)); d < T || d > T+T/4 {
				t.Fatalf("the proxy ended the query after %v (the client had it after %v): want the %v deadline and a tick of the sweeper", d, took, T)
			}
			if took > 2*T {
				t.Fatalf("the client had its answer after %v, the proxy's deadline %v", took, T)
			}
			if second.Total() != 1 {
				t.Fatalf("the second upstream received %d queries, want the one retry or hedge", second.Total())
			}
		})
	}
}

// A hedge: the first upstream answers only after 300ms, the hedge goes to
// the second after 50ms and is answered at once. The client gets exactly
// one answer, the hedge's; the first upstream's late answer, which reaches
// the proxy while the client still listens, is counted for that upstream
// and goes no further.
func TestLateAnswerFromTheHedgedAwayUpstream(t *testing.T) {
	first, second := startUpstream(t), startUpstream(t)
	first.SetMode(fakeupstream.Slow)
	first.SetDelay(300 * time.Millisecond)
	cfg := failoverConfig(first.Addr(), second.Addr())
	cfg.UpstreamTimeout, cfg.UpstreamHedge = time.Second, Hedge{After: 50 * time.Millisecond, Given: true}
	cfg.BreakerThreshold = 50
	a := startProxy(t, cfg, guard.RealClock{})

	c, err := net.Dial("udp", a.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	q := query("hedged.example.com", dns.TypeA)
	q.Id = 777
	b, _ := q.Pack()
	start := time.Now()
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	// Listen until well after the late answer came: every reply is counted.
	c.SetReadDeadline(start.Add(700 * time.Millisecond))
	var replies []time.Duration
	buf := make([]byte, 65535)
	for {
		n, err := c.Read(buf)
		if err != nil {
			break
		}
		m := new(dns.Msg)
		if m.Unpack(buf[:n]) != nil || m.Id != 777 || m.Rcode != dns.RcodeSuccess {
			t.Fatalf("a reply that is not the answer: %x", buf[:n])
		}
		replies = append(replies, time.Since(start))
	}
	if len(replies) != 1 || replies[0] >= 300*time.Millisecond {
		t.Fatalf("replies at %v, want exactly one, before the first upstream's 300ms", replies)
	}
	if got := upstreamCount(a, first.Addr(), "answer", 1); got != 1 {
		t.Fatalf("the first upstream's late answer counted %d times, want 1: it still reports", got)
	}
	if s := a.breaker(0).State(); s != guard.Closed {
		t.Fatalf("the first upstream's breaker %v, want closed: its late answer was an answer", s)
	}
	if got := int(testutil.ToFloat64(a.metrics.Retries.WithLabelValues("hedge"))); got != 1 {
		t.Fatalf("hedges %d, want 1", got)
	}
	if got := count(a, "A", "forwarded", 1); got != 1 {
		t.Fatalf("forwarded %d, want 1", got)
	}
}

// DNS_MAX_INFLIGHT counts queries, not attempts: a query answered by a
// hedge leaves its place while its first attempt is still out, so the next
// query is let in.
func TestInflightCountsQueriesNotAttempts(t *testing.T) {
	first, second := startUpstream(t), startUpstream(t)
	first.SetMode(fakeupstream.Blackhole)
	cfg := failoverConfig(first.Addr(), second.Addr())
	cfg.MaxInflight = 1
	cfg.UpstreamTimeout, cfg.UpstreamHedge = 2*time.Second, Hedge{After: 50 * time.Millisecond, Given: true}
	a := startProxy(t, cfg, guard.RealClock{})
	for i := range 2 {
		if r := ask(t, "udp", a.addr(), query(fmt.Sprintf("q%d.example.com", i), dns.TypeA)); r.Rcode != dns.RcodeSuccess {
			t.Fatalf("query %d: %s, want the hedge's answer", i, rcodeName(r))
		}
	}
	if first.Total() != 2 || count(a, "A", "overloaded", 0) != 0 {
		t.Fatalf("the first upstream holds %d attempts; overloaded %d: want 2 and 0", first.Total(), count(a, "A", "overloaded", 0))
	}
	if got := testutil.ToFloat64(a.metrics.InFlight); got != 0 {
		t.Fatalf("queries in flight %v with both answered, want 0", got)
	}
}

// round_robin spreads queries over the upstreams in turn.
func TestRoundRobinThroughTheProxy(t *testing.T) {
	ups := []*fakeupstream.Server{startUpstream(t), startUpstream(t), startUpstream(t)}
	cfg := failoverConfig(ups[0].Addr(), ups[1].Addr(), ups[2].Addr())
	cfg.UpstreamPolicy = UpstreamPolicy(pool.RoundRobin)
	a := startProxy(t, cfg, guard.RealClock{})
	for i := range 9 {
		ask(t, "udp", a.addr(), query(fmt.Sprintf("rr%d.example.com", i), dns.TypeA))
	}
	for i, up := range ups {
		if up.Total() != 3 {
			t.Fatalf("upstream %d received %d of 9 queries, want 3", i, up.Total())
		}
	}
}

// A flood while the first upstream is dead and hedging is on: thousands of
// queries wait for their deadline at once, hedges go out from one
// goroutine, and not one goroutine more is spent on them.
func TestFloodWithOneDeadUpstreamHoldsNoGoroutine(t *testing.T) {
	first, second := startUpstream(t), startUpstream(t)
	first.SetMode(fakeupstream.Blackhole)
	cfg := failoverConfig(first.Addr(), second.Addr())
	cfg.MaxInflight = 0
	cfg.UpstreamTimeout, cfg.UpstreamHedge = 2*time.Second, Hedge{After: 100 * time.Millisecond, Given: true}
	a := startProxy(t, cfg, guard.RealClock{})
	before := runtime.NumGoroutine()

	c, err := net.Dial("udp", a.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const flood = 3000
	for i := range flood {
		b, _ := query(fmt.Sprintf("f%d.example.com", i), dns.TypeA).Pack()
		c.Write(b)
		if i%100 == 99 {
			time.Sleep(time.Millisecond) // let the socket buffers drain: this is not a test of packet loss
		}
	}
	waitFor(t, "the flood to be waiting at the dead upstream", func() bool {
		return testutil.ToFloat64(a.metrics.InFlight) >= flood/2
	})
	hedgesAndRefusals := func() float64 {
		return testutil.ToFloat64(a.metrics.Retries.WithLabelValues("hedge")) + testutil.ToFloat64(a.metrics.RetryBudgetExhausted)
	}
	// Every waiting query comes to its hedge time: sent, or refused by the budget.
	waitFor(t, "the waiting queries' hedges to be decided", func() bool { return hedgesAndRefusals() >= flood/2 })
	if during := runtime.NumGoroutine(); during > before+10 {
		t.Fatalf("%d goroutines with %v queries waiting, %d before: a waiting query or hedge must not hold one",
			during, testutil.ToFloat64(a.metrics.InFlight), before)
	}
	hedges := testutil.ToFloat64(a.metrics.Retries.WithLabelValues("hedge"))
	if exhausted := testutil.ToFloat64(a.metrics.RetryBudgetExhausted); hedges > flood*0.1+30 || exhausted == 0 {
		t.Fatalf("%v hedges and %v refused by the budget for %d queries: the budget must hold them to about 10%%",
			hedges, exhausted, flood)
	}
}
