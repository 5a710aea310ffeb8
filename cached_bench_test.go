package main

import (
	"io"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/miekg/dns"

	"dnsproxi/dnsserver"
	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
)

// discardWriter is a ResponseWriter that keeps nothing: what a hit costs
// is the proxy's own.
type discardWriter struct{}

func (discardWriter) Write([]byte) error { return nil }
func (discardWriter) Drop()              {}

// BenchmarkCacheHit runs a cached query through the parse step and
// handleQuery — the entry gates on, the lookup, the answer built for the
// client — with no network: the hit path's own cost, serial and parallel.
// The server's parse step allocates the Query (the UDP reader allocates it
// with its writer, in one piece); the hit itself allocates nothing.
func BenchmarkCacheHit(b *testing.B) {
	up, err := fakeupstream.Start("127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { up.Close() })
	cfg := withCache(testConfig(up.Addr()))
	cfg.RateLimit = RateLimit{Rate: 1e8, Burst: 1e8}
	cfg.BreakerThreshold = 50
	a, err := newApp(cfg, guard.RealClock{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.upstreams.Close() })
	client := netip.MustParseAddrPort("127.0.0.1:5353")
	srv := &dnsserver.Server{Handler: dnsserver.HandlerFunc(func(w dnsserver.ResponseWriter, q *dnsserver.Query) {
		q.Client = client
		a.proxy.handleQuery(w, q)
	})}
	q := new(dns.Msg)
	q.SetQuestion("www.example.com.", dns.TypeA)
	q.SetEdns0(1232, false)
	pkt, _ := q.Pack()
	w := &waitingRecorder{done: make(chan struct{})}
	srv.ServePacket(w, append([]byte(nil), pkt...))
	<-w.done
	if len(w.out) != 1 || count(a, "A", "forwarded", 1) != 1 {
		b.Fatal("priming failed")
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		buf := append([]byte(nil), pkt...)
		for b.Loop() {
			srv.ServePacket(discardWriter{}, buf)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			buf := append([]byte(nil), pkt...)
			for pb.Next() {
				srv.ServePacket(discardWriter{}, buf)
			}
		})
	})
}
