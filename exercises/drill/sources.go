package main

import (
	"fmt"
	"net"
	"time"

	"github.com/miekg/dns"
)

// drillSources floods the per-client gate from 2 × DNS_CLIENT_TABLE_SIZE
// distinct loopback sources (127.x.y.z: Linux routes all of 127/8 to lo),
// one query each from a socket bound to its address, and reads the proxy's
// RSS, beside the same flood with the gate off: the difference is the
// table, and the second 100,000 sources add nothing to it.
func drillSources(r *rig) error {
	const table = 100_000
	r.printf("sources: one query from each of %d distinct sources in 127.1.0.0/15, about 20,000 a second,\n", 2*table)
	r.printf("  with the per-client gate off, then on (DNS_CLIENT_RATE_LIMIT=1,1, DNS_CLIENT_TABLE_SIZE=%d)\n\n", table)
	r.printf("  %-12s %-22s %8s %9s %10s %10s\n", "gate", "after", "RSS", "entries", "evictions", "overflows")
	var end [2]float64
	for i, env := range []map[string]string{{}, {"DNS_CLIENT_RATE_LIMIT": "1,1", "DNS_CLIENT_TABLE_SIZE": fmt.Sprint(table)}} {
		gate := "off"
		if len(env) > 0 {
			gate = "per-client"
		}
		if err := r.startProxy(env); err != nil {
			return err
		}
		row := func(what string) float64 {
			time.Sleep(500 * time.Millisecond) // the last queries counted
			s := r.scrape()
			rss := s.Get("process_resident_memory_bytes") / 1e6
			r.printf("  %-12s %-22s %6.1fMB %9.0f %10.0f %10.0f\n", gate, what, rss, s.Get("dnsproxi_client_table_entries"),
				s.Get("dnsproxi_client_table_evictions_total"), s.Get("dnsproxi_client_overflow_total"))
			return rss
		}
		row("start")
		for half := range 2 {
			if err := sendFromSources(r.proxy.Addr, half*table, (half+1)*table); err != nil {
				return err
			}
			end[i] = row(fmt.Sprintf("%d sources", (half+1)*table))
		}
		r.stopProxy()
	}
	r.printf("\n  Notice: the table's slots are allocated at start-up (16 bytes each, %.1f MB) and touched as\n", 16*table/1e6)
	r.printf("  prefixes arrive; once full, a new prefix evicts an idle bucket or shares the overflow bucket,\n")
	r.printf("  so a flood from ever more sources adds nothing: what RSS there is beyond the gate-off run is the table.\n")
	r.numbers = map[string]int{"rss_off_mb": int(end[0]), "rss_on_mb": int(end[1])}
	r.expect(end[1]-end[0] <= 10, "with the gate on RSS is %.1f MB above the gate off, want ≤ 10 (a 2.4 MB table)", end[1]-end[0])
	return nil
}

// sendFromSources sends one query from each source 127.(1+i>>16).(i>>8).i
// for i in [from, to), each from a socket bound to it, 20,000 a second.
func sendFromSources(addr string, from, to int) error {
	dst, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return err
	}
	q := new(dns.Msg)
	q.SetQuestion("www.example.com.", dns.TypeA)
	b, _ := q.Pack()
	began := time.Now()
	for i := from; i < to; i++ {
		c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, byte(1+i>>16), byte(i>>8), byte(i))})
		if err != nil {
			return err
		}
		c.WriteToUDP(b, dst)
		c.Close()
		if wait := time.Until(began.Add(time.Duration(i-from) * 50 * time.Microsecond)); wait > 0 {
			time.Sleep(wait)
		}
	}
	return nil
}
