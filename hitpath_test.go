package main

import (
	"io"
	"log/slog"
	"net/netip"
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
