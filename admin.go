package main

import (
	"fmt"
	"net/http"
	"net/netip"
)

// flushPath is the admin endpoint that empties the answer cache: POST it on
// the metrics listener (DNS_METRICS_ADDR), from the machine itself.
const flushPath = "/cache/flush"

// flushHandler serves POST /cache/flush: it empties the cache and says how
// many answers it held. Only a loopback peer may flush, whatever address
// DNS_METRICS_ADDR listens on, since a flush sends every name back to the
// upstream; anything but POST is refused, so a crawler or a browser's
// prefetch cannot flush by reading the page; and a request a browser sent
// (marked by Origin or Sec-Fetch-Site) is refused, so a web page open on
// the machine cannot flush with a form POST to 127.0.0.1, nor a page whose
// name was rebound to it (TestCacheFlushRefusesABrowsersRequest).
func (a *app) flushHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "use POST to flush the cache", http.StatusMethodNotAllowed)
			return
		}
		if ap, err := netip.ParseAddrPort(r.RemoteAddr); err != nil || !ap.Addr().Unmap().IsLoopback() {
			http.Error(w, "the cache is flushed from loopback only", http.StatusForbidden)
			return
		}
		if r.Header.Get("Origin") != "" || r.Header.Get("Sec-Fetch-Site") != "" {
			http.Error(w, "the cache is flushed by a command (curl -X POST), not from a web page", http.StatusForbidden)
			return
		}
		if a.proxy.cache == nil {
			http.Error(w, "the cache is off (DNS_CACHE_SIZE is unset): nothing to flush", http.StatusNotFound)
			return
		}
		store := a.proxy.cache.store
		n := store.Stats().Entries
		store.Flush()
		a.eventLog.Info("cache flushed", "entries", n, "from", r.RemoteAddr) // queued: a stalled stderr holds no answer
		fmt.Fprintf(w, "flushed %d answers\n", n)
	})
}
