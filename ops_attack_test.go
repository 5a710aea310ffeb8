package main

import (
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

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
	// Past every timeout of the metrics listener (header 5 s, idle 30 s,
	// write 30 s), with a margin.
	time.Sleep(metricsIdleTimeout + metricsWriteTimeout/6)

	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("GET /healthz %v after %d requests with an unsent body were opened: %v; want 200 (a place freed within 30 s)",
			metricsIdleTimeout+metricsWriteTimeout/6, maxMetricsConns, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /healthz: %d, want 200", resp.StatusCode)
	}
}
