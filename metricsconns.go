package main

import (
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// maxMetricsConns bounds the connections the metrics address serves at
// once (/metrics, /healthz, /readyz, the cache flush): a scraper and a
// health checker need a few. Beyond it a new connection waits in the
// kernel's backlog, holding none of the process's file descriptors, until
// one closes. Without a bound, connections held open and idle there took
// every descriptor, and accept failed for DNS over TCP as well. The
// descriptors DNS_TCP_MAX_CONNS leaves for the process's other sockets and
// files count these (descriptors.go).
const maxMetricsConns = 64

// metricsIdleTimeout closes a keep-alive connection to the metrics address
// that sends no next request for this long, so one held open and idle
// frees its place; a scraper that comes back later reconnects.
// metricsWriteTimeout bounds the writing of one response to a client that
// does not read it. metricsReadTimeout bounds the reading of one request,
// its body included: after the handler the server reads what is left of an
// announced body, and without it a request whose body never came held its
// place for good (TestAttackUnsentBodiesHoldTheMetricsListener).
const (
	metricsIdleTimeout  = 30 * time.Second
	metricsWriteTimeout = 30 * time.Second
	metricsReadTimeout  = 10 * time.Second
)

// serveMetrics serves mux on ln, at most maxMetricsConns connections at
// once, each bounded in time.
func serveMetrics(ln net.Listener, mux http.Handler) *http.Server {
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       metricsReadTimeout,
		WriteTimeout:      metricsWriteTimeout,
		IdleTimeout:       metricsIdleTimeout,
	}
	go srv.Serve(netutil.LimitListener(ln, maxMetricsConns))
	return srv
}
