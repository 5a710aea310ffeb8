package main

import "net/http"

// Probes for orchestrators, served beside /metrics. /healthz answers 200
// while the process serves at all. /readyz answers 200 while the DNS server
// listens and is not draining, 503 otherwise. Readiness never looks at the
// breakers: a replica marked unready gets no queries, so its breakers could
// never see the upstream heal, and every replica shares that upstream;
// upstream health belongs in the alerts (deploy/prometheus).

// handleHealthz answers that the process serves.
func (a *app) handleHealthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Write([]byte("ok\n"))
}

// handleReadyz answers whether the proxy takes queries: listening, and not
// draining for a shutdown.
func (a *app) handleReadyz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	switch {
	case a.draining.Load():
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte("draining\n"))
	case !a.listening.Load():
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte("not listening yet\n"))
	default:
		w.Write([]byte("ready\n"))
	}
}
