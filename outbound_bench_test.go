package main

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
)

// benchOutboundProxy starts the whole proxy with the outbound limit off,
// or shared on redisURL at a rate far above any load.
func benchOutboundProxy(b *testing.B, redisURL string) string {
	b.Helper()
	cfg := testConfig(echoUpstream(b))
	cfg.MaxInflight = 0
	if redisURL != "" {
		cfg.UpstreamRateLimit = RateLimit{Rate: maxRate, Burst: maxBurst}
		cfg.UpstreamRateLimitRedis = RedisURL(redisURL)
		cfg.UpstreamRateLimitKey = "bench"
		cfg.UpstreamRateLimitTimeout = time.Second
	}
	a, err := newApp(cfg, guard.RealClock{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	if err := a.start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.shutdown(b.Context()) })
	return a.addr()
}

// BenchmarkUDPPathOutbound is the whole UDP path, parallel, with the
// outbound limit off and shared on one real Redis (a rate far above the
// load, so nothing is refused), interleaved over three rounds in one run:
// the price of the fleet limit is the ratio of the two.
func BenchmarkUDPPathOutbound(b *testing.B) {
	r := startRedisProc(b)
	q := new(dns.Msg)
	q.SetQuestion("www.example.com.", dns.TypeA)
	wire, _ := q.Pack()
	off, fleet := benchOutboundProxy(b, ""), benchOutboundProxy(b, r.URL())
	for round := range 3 {
		for _, tt := range []struct{ name, addr string }{{"off", off}, {"fleet", fleet}} {
			b.Run(fmt.Sprintf("%s-%d", tt.name, round+1), func(b *testing.B) {
				b.ReportAllocs()
				b.SetParallelism(8)
				b.RunParallel(func(pb *testing.PB) {
					c := dialBench(b, tt.addr)
					defer c.Close()
					myQ := append([]byte(nil), wire...)
					buf := make([]byte, 65535)
					id := uint16(0)
					for pb.Next() {
						id++
						roundTrip(b, c, myQ, buf, id)
					}
				})
			})
		}
	}
}
