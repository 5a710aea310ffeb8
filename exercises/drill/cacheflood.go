package main

import (
	"time"

	"dnsproxi/exercises/fakeupstream"
)

// drillCacheFlood floods the proxy with unique names, every answer
// cacheable, with DNS_CACHE_SIZE set and then without the cache, and reads
// what the cache counts against its bound beside the process's RSS.
func drillCacheFlood(r *rig) error {
	size, sizeText, rate, d := 64<<20, "64MB", 15000, 30*time.Second
	if r.scale < 1 {
		size, sizeText, rate, d = 4<<20, "4MB", 5000, 3*time.Second
	}
	r.printf("cache-flood: %d unique names a second for %s (%d in all), each answer cacheable (TTL 60),\n", rate, secs(d), rate*int(d.Seconds()))
	r.printf("  with DNS_CACHE_SIZE=%s, then without the cache\n\n", sizeText)
	r.printf("  %-10s %-10s %9s %12s %11s %9s %10s %10s\n", "cache", "after", "RSS", "cache bytes", "heap goal", "entries", "evictions", "answered")
	r.up.SetMode(fakeupstream.OK)
	var rss [2]float64
	var held float64
	for i, env := range []map[string]string{{"DNS_CACHE_SIZE": sizeText}, {}} {
		name := sizeText
		if len(env) == 0 {
			name = "off"
		}
		env["DNS_MAX_INFLIGHT"] = "0"
		if err := r.startProxy(env); err != nil {
			return err
		}
		row := func(what string, answered int) {
			s := r.scrape()
			rss[i] = s.Get("process_resident_memory_bytes") / 1e6
			if len(env) > 1 {
				held = max(held, s.Get("dnsproxi_cache_bytes"))
			}
			r.printf("  %-10s %-10s %7.1fMB %10.1fMB %9.1fMB %9.0f %10.0f %10d\n", name, what, rss[i], s.Get("dnsproxi_cache_bytes")/1e6,
				s.Get("go_memstats_next_gc_bytes")/1e6, s.Get("dnsproxi_cache_entries"), s.Get("dnsproxi_cache_evictions_total"), answered)
		}
		row("start", 0)
		_, answeredAt, _, err := flood(r.proxy.Addr, rate, d, time.Second)
		if err != nil {
			return err
		}
		answered := 0
		for _, at := range answeredAt {
			if at >= 0 {
				answered++
			}
		}
		row("flood", answered)
		r.stopProxy()
	}
	r.printf("\n  Notice: the cache counts its bytes (stored answers, %d bytes of bookkeeping an entry, the ghost\n", 168)
	r.printf("  tables) and evicts beyond DNS_CACHE_SIZE. RSS beside the cacheless run is more than those bytes:\n")
	r.printf("  evicted answers are garbage until the collector runs, and with GOGC=100 it lets the heap grow to\n")
	r.printf("  twice what was live after the last collection (the heap goal) before it does.\n")
	r.numbers = map[string]int{"rss_cache_mb": int(rss[0]), "rss_off_mb": int(rss[1]), "held_mb": int(held / 1e6)}
	r.expect(held <= float64(size), "the cache counted %.0f bytes, over its bound of %d", held, size)
	return nil
}
