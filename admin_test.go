package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dnsproxi/guard"
)

// POST /cache/flush on the metrics listener empties the cache: the next
// query goes upstream again. Anything but POST, and any peer but loopback,
// flushes nothing.
func TestCacheFlushEndpoint(t *testing.T) {
	a, up, _ := startCaching(t, func(c *Config) { c.MetricsAddr = "127.0.0.1:0" })
	ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA))
	ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA))
	if up.Total() != 1 {
		t.Fatalf("the upstream received %d queries, want 1: the second from the cache", up.Total())
	}
	url := strings.TrimSuffix(a.metricsURL(), "/metrics") + flushPath

	get, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	get.Body.Close()
	if get.StatusCode != http.StatusMethodNotAllowed || get.Header.Get("Allow") != "POST" {
		t.Errorf("GET: %s, Allow %q; want 405, POST", get.Status, get.Header.Get("Allow"))
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, flushPath, nil)
	r.RemoteAddr = "192.0.2.7:40000"
	a.flushHandler().ServeHTTP(w, r)
	if w.Code != http.StatusForbidden {
		t.Errorf("POST from 192.0.2.7: %d, want 403", w.Code)
	}
	if n := metric(t, a, "dnsproxi_cache_entries"); n != 1 {
		t.Fatalf("cache_entries %v after refused flushes, want 1", n)
	}

	resp, err := http.Post(url, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "flushed 1 answers\n" {
		t.Fatalf("POST: %s %q", resp.Status, body)
	}
	if n := metric(t, a, "dnsproxi_cache_entries"); n != 0 {
		t.Errorf("cache_entries %v after the flush", n)
	}
	ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA))
	if up.Total() != 2 {
		t.Errorf("the upstream received %d queries, want 2: the flushed name asked again", up.Total())
	}
}

// With the cache off there is nothing to flush: the endpoint is not served.
func TestCacheFlushEndpointOffWithoutCache(t *testing.T) {
	up := startUpstream(t)
	cfg := testConfig(up.Addr())
	cfg.MetricsAddr = "127.0.0.1:0"
	a := startProxy(t, cfg, guard.RealClock{})
	resp, err := http.Post(strings.TrimSuffix(a.metricsURL(), "/metrics")+flushPath, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("POST with the cache off: %s, want 404", resp.Status)
	}
}

// The cache's series are on /metrics from the start and pass Prometheus's
// linter.
func TestCacheMetricsLint(t *testing.T) {
	a, _, _ := startCaching(t, func(c *Config) { c.MetricsAddr = "127.0.0.1:0" })
	resp, err := http.Get(a.metricsURL())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`dnsproxi_queries_total{outcome="cached",qtype="A"} 0`,
		`dnsproxi_queries_total{outcome="stale",qtype="OTHER"} 0`,
		`dnsproxi_cache_entries 0`,
		`dnsproxi_cache_bytes `,
		`dnsproxi_cache_evictions_total 0`,
		`dnsproxi_cache_refreshes_total{result="failed"} 0`,
	} {
		if !strings.Contains(string(body), want) {
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
}

// A web page open in a browser on the proxy's own machine can send a form
// POST to 127.0.0.1 (a "simple" request: no preflight), and a page whose
// name was rebound to 127.0.0.1 can even send it same-origin. Browsers mark
// both (Origin, Sec-Fetch-Site); curl and scripts send neither. A flush
// carrying either is refused, and the cache keeps its answers.
func TestCacheFlushRefusesABrowsersRequest(t *testing.T) {
	a, _, _ := startCaching(t, nil)
	ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA))
	for _, h := range []struct{ name, value string }{
		{"Origin", "http://attacker.example"},
		{"Origin", "http://rebound.example:9398"},
		{"Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Site", "same-origin"},
	} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, flushPath, strings.NewReader("x=1"))
		r.RemoteAddr = "127.0.0.1:40000"
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set(h.name, h.value)
		a.flushHandler().ServeHTTP(w, r)
		if w.Code != http.StatusForbidden {
			t.Errorf("POST from loopback with %s: %s: %d, want 403", h.name, h.value, w.Code)
		}
	}
	if n := metric(t, a, "dnsproxi_cache_entries"); n != 1 {
		t.Fatalf("cache_entries %v after the browser's flushes, want 1", n)
	}
}

// With the cache off there is nothing to flush, and the operator who
// POSTs /cache/flush (a fleet's script, say, across instances configured
// differently) is told so, naming the variable, rather than given the
// mux's bare "404 page not found", which reads as a wrong address.
func TestCacheFlushWithTheCacheOffSaysSo(t *testing.T) {
	up := startUpstream(t)
	cfg := testConfig(up.Addr())
	cfg.MetricsAddr = "127.0.0.1:0"
	a := startProxy(t, cfg, nil)
	url := strings.TrimSuffix(a.metricsURL(), "/metrics") + flushPath
	resp, err := http.Post(url, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "DNS_CACHE_SIZE") {
		t.Fatalf("POST with the cache off: %s %q; want 404 saying the cache is off (DNS_CACHE_SIZE)", resp.Status, body)
	}
}
