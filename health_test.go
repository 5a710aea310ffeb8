package main

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
)

// probe GETs path on a's metrics listener and returns the status code.
func probe(t *testing.T, a *app, path string) int {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + a.metricsLn.Addr().String() + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// /healthz says the process serves; /readyz that it listens and is not
// draining. Readiness never follows the breaker: an unready replica gets
// no queries, so its breaker could never close again.
func TestHealthAndReadiness(t *testing.T) {
	t.Run("breaker open", func(t *testing.T) {
		up := startUpstream(t)
		cfg := testConfig(up.Addr())
		cfg.MetricsAddr = "127.0.0.1:0"
		cfg.UpstreamTimeout = 100 * time.Millisecond
		cfg.BreakerThreshold, cfg.BreakerMinSamples, cfg.BreakerWindow = 50, 1, 1
		a := startProxy(t, cfg, guard.NewManualClock(time.Now())) // the clock stands still: open stays open
		checkProbes(t, a, "serving", http.StatusOK, http.StatusOK)

		up.SetMode(fakeupstream.Blackhole)
		if r := ask(t, "udp", a.addr(), query("dead.example.com", dns.TypeA)); r.Rcode != dns.RcodeServerFailure {
			t.Fatalf("blackholed upstream: %s, want SERVFAIL", rcodeName(r))
		}
		if s := a.breaker(0).State(); s != guard.Open {
			t.Fatalf("breaker %v after a timeout with MinSamples 1, want open", s)
		}
		checkProbes(t, a, "breaker open", http.StatusOK, http.StatusOK)
	})

	// A query held at the upstream keeps the shutdown draining.
	t.Run("draining", func(t *testing.T) {
		up := startUpstream(t)
		held, release := holdGate(t)
		up.SetScript(func(req *dns.Msg, _ string) [][]byte {
			<-held
			b, _ := answerFor(req).Pack()
			return [][]byte{b}
		})
		cfg := testConfig(up.Addr())
		cfg.MetricsAddr = "127.0.0.1:0"
		cfg.UpstreamTimeout = 10 * time.Second // the query is held, not timed out, while the test looks
		a := startProxy(t, cfg, guard.RealClock{})
		checkProbes(t, a, "serving", http.StatusOK, http.StatusOK)
		go tryAsk("udp", a.addr(), query("held.example.com", dns.TypeA), 10*time.Second)
		waitFor(t, "the query to reach the upstream", func() bool { return up.Total() == 1 })
		stopped := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			stopped <- a.shutdown(ctx)
		}()
		waitFor(t, "/readyz to say draining", func() bool { return probe(t, a, "/readyz") == http.StatusServiceUnavailable })
		checkProbes(t, a, "draining", http.StatusOK, http.StatusServiceUnavailable)
		release()
		select {
		case err := <-stopped:
			if err != nil {
				t.Fatalf("shutdown: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("shutdown did not finish after the held query was answered")
		}
	})
}

// checkProbes asserts the status codes of /healthz and /readyz.
func checkProbes(t *testing.T, a *app, when string, health, ready int) {
	t.Helper()
	if got := probe(t, a, "/healthz"); got != health {
		t.Errorf("%s: /healthz %d, want %d", when, got, health)
	}
	if got := probe(t, a, "/readyz"); got != ready {
		t.Errorf("%s: /readyz %d, want %d", when, got, ready)
	}
}
