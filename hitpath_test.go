package main

import (
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/dnsserver"
	"dnsproxi/guard"
)

// countingClock is a manual clock that counts its readings.
type countingClock struct {
	*guard.ManualClock
	reads atomic.Int64
}

func (c *countingClock) Now() time.Time {
	c.reads.Add(1)
	return c.ManualClock.Now()
}

// TestCacheHitReadsClockOnce proves that a cache hit reads the injected
// clock once, however many gates it passes: the entry gates and the lookup
// share one reading (time.Now is slow on a VM, and a hit is short).
func TestCacheHitReadsClockOnce(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Config)
	}{
		{"cache alone", func(*Config) {}},
		{"global bucket", func(c *Config) { c.RateLimit = RateLimit{Rate: 1e6, Burst: 1e6} }},
		{"client and global buckets", func(c *Config) {
			c.RateLimit = RateLimit{Rate: 1e6, Burst: 1e6}
			c.ClientRateLimit = RateLimit{Rate: 1e6, Burst: 1e6}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := startUpstream(t)
			cfg := withCache(testConfig(up.Addr()))
			tt.change(&cfg)
			clock := &countingClock{ManualClock: guard.NewManualClock(tc0)}
			a, err := newApp(cfg, clock, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { a.upstreams.Close() })
			srv := &dnsserver.Server{Handler: dnsserver.HandlerFunc(func(w dnsserver.ResponseWriter, q *dnsserver.Query) {
				q.Client = netip.MustParseAddrPort("127.0.0.1:5353")
				a.proxy.handleQuery(w, q)
			})}
			m := query("www.example.com.", dns.TypeA)
			m.SetEdns0(1232, false)
			pkt, _ := m.Pack()
			w := &waitingRecorder{done: make(chan struct{})}
			srv.ServePacket(w, append([]byte(nil), pkt...))
			select {
			case <-w.done:
			case <-time.After(5 * time.Second):
				t.Fatal("no answer to the priming query within 5 s")
			}
			const hits = 100
			before := clock.reads.Load()
			for range hits {
				var r recorder
				srv.ServePacket(&r, append([]byte(nil), pkt...))
				if len(r.out) != 1 {
					t.Fatalf("a hit got %d answers, want 1 written at once", len(r.out))
				}
			}
			if got := count(a, "A", "cached", hits); got != hits {
				t.Fatalf("cached = %d, want %d", got, hits)
			}
			if reads := clock.reads.Load() - before; reads != hits {
				t.Errorf("%d hits read the clock %d times, want %d (once each)", hits, reads, hits)
			}
		})
	}
}

// requestDurations returns the request-duration histogram's count and sum.
func requestDurations(t *testing.T, a *app) (uint64, float64) {
	t.Helper()
	mfs, err := a.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "dnsproxi_request_duration_seconds" {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	t.Fatal("no dnsproxi_request_duration_seconds")
	return 0, 0
}

// TestCacheHitTakesNoSecondReading proves that a hit answered at once is
// timed without reading the clock again: it counts in the request-duration
// histogram as taking 0 s (its own microsecond is a hundredth of the first
// bucket), unless the query log is on, whose lines say how long it took.
func TestCacheHitTakesNoSecondReading(t *testing.T) {
	tests := []struct {
		name     string
		queryLog bool
	}{
		{"query log off: 0 s", false},
		{"query log on: as measured", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := startUpstream(t)
			cfg := withCache(testConfig(up.Addr()))
			if tt.queryLog {
				cfg.QueryLog = QueryLogTarget(filepath.Join(t.TempDir(), "queries.log"))
			}
			a, err := newApp(cfg, guard.RealClock{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				a.upstreams.Close()
				if a.proxy.qlog != nil {
					closeQueryLog(t, a.proxy.qlog)
				}
			})
			srv := &dnsserver.Server{Handler: dnsserver.HandlerFunc(func(w dnsserver.ResponseWriter, q *dnsserver.Query) {
				q.Client = netip.MustParseAddrPort("127.0.0.1:5353")
				a.proxy.handleQuery(w, q)
			})}
			pkt, _ := query("www.example.com.", dns.TypeA).Pack()
			w := &waitingRecorder{done: make(chan struct{})}
			srv.ServePacket(w, append([]byte(nil), pkt...))
			select {
			case <-w.done:
			case <-time.After(5 * time.Second):
				t.Fatal("no answer to the priming query within 5 s")
			}
			// The priming query is recorded after its answer is written: wait
			// for it to be counted before taking the baseline.
			n0, sum0 := requestDurations(t, a)
			for deadline := time.Now().Add(5 * time.Second); n0 < 1; n0, sum0 = requestDurations(t, a) {
				if time.Now().After(deadline) {
					t.Fatal("the priming query was never counted in the request-duration histogram")
				}
				time.Sleep(time.Millisecond)
			}
			const hits = 50
			for range hits {
				var r recorder
				srv.ServePacket(&r, append([]byte(nil), pkt...))
				if len(r.out) != 1 {
					t.Fatalf("a hit got %d answers, want 1 written at once", len(r.out))
				}
			}
			n, sum := requestDurations(t, a)
			if n-n0 != hits {
				t.Fatalf("%d hits observed %d times", hits, n-n0)
			}
			if measured := sum > sum0; measured != tt.queryLog {
				t.Errorf("%d hits added %g s to the histogram's sum: measured %v, want %v", hits, sum-sum0, measured, tt.queryLog)
			}
		})
	}
}
