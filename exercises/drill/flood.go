package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/exercises/fakeupstream"
)

// floodSockets is how many client sockets the flood spreads its queries over.
const floodSockets = 8

// floodResult is what one flood measured.
type floodResult struct {
	name                       string
	sent, answered             int
	within10ms, within1s       int
	afterTrip, afterTripFast   int // queries sent after the breaker opened, and those answered within 10 ms
	rssStartMB, rssEndMB       float64
	peakGoroutines             float64
	upstreamPackets            int64
	tripAt                     time.Duration // -1: never opened
	forwarded, refused, failed int
	breakerOpen                int
}

// flood sends rate unique queries per second for d over floodSockets UDP
// sockets and records when each was answered.
func flood(addr string, rate int, d time.Duration, wait time.Duration) (sentAt, answeredAt []time.Duration, start time.Time, err error) {
	n := int(float64(rate) * d.Seconds())
	sentAt = make([]time.Duration, n)
	answeredAt = make([]time.Duration, n)
	for i := range answeredAt {
		answeredAt[i] = -1
	}
	var socks []*net.UDPConn
	raddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, nil, start, err
	}
	for range floodSockets {
		c, err := net.DialUDP("udp", nil, raddr)
		if err != nil {
			return nil, nil, start, err
		}
		c.SetReadBuffer(4 << 20)
		defer c.Close()
		socks = append(socks, c)
	}
	start = time.Now()
	var mu sync.Mutex
	var readers sync.WaitGroup
	for s, c := range socks {
		readers.Go(func() {
			buf := make([]byte, 65535)
			for {
				k, err := c.Read(buf)
				if err != nil {
					return // the deadline set after the flood
				}
				if k < 12 {
					continue
				}
				seq := int(binary.BigEndian.Uint16(buf))*floodSockets + s
				if seq >= n {
					continue
				}
				now := time.Since(start)
				mu.Lock()
				if answeredAt[seq] < 0 {
					answeredAt[seq] = now
				}
				mu.Unlock()
			}
		})
	}
	q := new(dns.Msg)
	for seq := range n {
		if due := start.Add(time.Duration(seq) * time.Second / time.Duration(rate)); time.Until(due) > 0 {
			time.Sleep(time.Until(due))
		}
		q.SetQuestion(fmt.Sprintf("f%d.example.com.", seq), dns.TypeA)
		q.Id = uint16(seq / floodSockets)
		b, _ := q.Pack()
		mu.Lock()
		sentAt[seq] = time.Since(start)
		mu.Unlock()
		socks[seq%floodSockets].Write(b)
	}
	time.Sleep(wait)
	for _, c := range socks {
		c.SetReadDeadline(time.Now())
	}
	readers.Wait()
	return sentAt, answeredAt, start, nil
}

// drillBlackholeFlood is the overload harness: a blackholed upstream, rate
// QPS of unique queries for d, in three configurations.
func drillBlackholeFlood(r *rig) error {
	rate := 3000
	d := 15 * time.Second
	if r.scale < 1 {
		rate, d = 1000, 3*time.Second
	}
	timeout := 2 * time.Second
	configs := []struct {
		name string
		env  map[string]string
	}{
		{"no gates", map[string]string{"DNS_MAX_INFLIGHT": "0"}},
		{"in-flight cap only", map[string]string{"DNS_MAX_INFLIGHT": "1000"}},
		{"breaker on (+cap)", map[string]string{"DNS_MAX_INFLIGHT": "1000", "DNS_BREAKER_THRESHOLD": "50"}},
	}
	r.printf("blackhole-flood: a blackholed upstream, %d QPS of unique queries for %s, upstream timeout %s\n\n", rate, secs(d), secs(timeout))
	var results []floodResult
	for _, c := range configs {
		r.up.SetMode(fakeupstream.Blackhole)
		before := r.up.Total()
		c.env["DNS_UPSTREAM_TIMEOUT"] = timeout.String()
		if err := r.startProxy(c.env); err != nil {
			return err
		}
		start := r.scrape()
		peak := r.watchPeak(d + timeout)
		sentAt, answeredAt, t0, err := flood(r.proxy.Addr, rate, d, timeout+500*time.Millisecond)
		if err != nil {
			return err
		}
		p := <-peak
		end := r.scrape()
		res := floodResult{
			name: c.name, sent: len(sentAt), rssStartMB: start.Get("process_resident_memory_bytes") / 1e6,
			rssEndMB: end.Get("process_resident_memory_bytes") / 1e6, peakGoroutines: p[0],
			upstreamPackets: r.up.Total() - before, tripAt: tripTime(r.proxy.Log(), t0),
			forwarded: end.Outcome("forwarded"), refused: end.Outcome("overloaded"),
			failed: end.Outcome("upstream_error"), breakerOpen: end.Outcome("breaker_open"),
		}
		for i, at := range answeredAt {
			if at < 0 {
				continue
			}
			res.answered++
			lat := at - sentAt[i]
			if lat <= 10*time.Millisecond {
				res.within10ms++
			}
			if lat <= time.Second {
				res.within1s++
			}
			if res.tripAt >= 0 && sentAt[i] > res.tripAt {
				res.afterTrip++
				if lat <= 10*time.Millisecond {
					res.afterTripFast++
				}
			}
		}
		for i := range sentAt {
			if res.tripAt >= 0 && sentAt[i] > res.tripAt && answeredAt[i] < 0 {
				res.afterTrip++ // unanswered after the trip: counts against the share
			}
		}
		results = append(results, res)
		r.stopProxy()
	}
	pct := func(a, b int) string { return fmt.Sprintf("%.1f%%", 100*float64(a)/float64(max(b, 1))) }
	r.printf("  %-20s %9s %9s %10s %8s %8s %9s %22s\n", "config", "RSS start", "RSS end", "peak gorou", "≤10ms", "≤1s", "upstream", "after trip ≤10ms")
	for _, x := range results {
		after := "-"
		if x.tripAt >= 0 {
			after = fmt.Sprintf("%s of %d (trip %s)", pct(x.afterTripFast, x.afterTrip), x.afterTrip, secs(x.tripAt))
		}
		r.printf("  %-20s %7.1fMB %7.1fMB %10.0f %8s %8s %9d %22s\n", x.name, x.rssStartMB, x.rssEndMB, x.peakGoroutines,
			pct(x.within10ms, x.sent), pct(x.within1s, x.sent), x.upstreamPackets, after)
	}
	r.printf("\n  outcomes: ")
	for _, x := range results {
		r.printf("%s: forwarded %d, upstream_error %d, overloaded %d, breaker_open %d; ", x.name, x.forwarded, x.failed, x.refused, x.breakerOpen)
	}
	r.printf("\n\n  Notice: with no gates every query waits the full %s, so the queries in flight follow the\n", secs(timeout))
	r.printf("  attacker's rate × the deadline (each is a table entry, not a goroutine: goroutines stay flat).\n")
	r.printf("  The cap bounds them by configuration and refuses the rest at once. The breaker stops the\n")
	r.printf("  waiting altogether: after the trip, answers take microseconds and the upstream sees one\n")
	r.printf("  probe per cool-off.\n")

	none, capped, brk := results[0], results[1], results[2]
	r.numbers = map[string]int{"cap_peak_goroutines": int(capped.peakGoroutines), "breaker_after_trip_fast": brk.afterTripFast,
		"breaker_after_trip": brk.afterTrip, "none_peak_goroutines": int(none.peakGoroutines)}
	r.expect(brk.tripAt >= 0, "the breaker never opened")
	r.expect(brk.rssEndMB-brk.rssStartMB <= 10, "breaker on: RSS grew %.1f MB, want ≤ 10", brk.rssEndMB-brk.rssStartMB)
	r.expect(float64(brk.afterTripFast) >= 0.99*float64(brk.afterTrip), "breaker on: %d of %d answered within 10ms after the trip, want ≥ 99%%", brk.afterTripFast, brk.afterTrip)
	r.expect(brk.upstreamPackets <= int64(brk.failed)+int64(d/(5*time.Second))+2,
		"breaker on: the upstream received %d packets, want the %d before the trip and about one probe per cool-off", brk.upstreamPackets, brk.failed)
	r.expect(capped.rssEndMB-capped.rssStartMB <= 50, "cap only: RSS grew %.1f MB, want ≤ 50", capped.rssEndMB-capped.rssStartMB)
	r.expect(capped.peakGoroutines <= 1000+100, "cap only: %.0f goroutines at the peak, want ≤ the cap (1000) + 100", capped.peakGoroutines)
	r.expect(none.peakGoroutines <= 100, "no gates: %.0f goroutines at the peak: a waiting query must not hold one", none.peakGoroutines)
	return nil
}

// tripTime finds when the proxy logged its first closed→open transition,
// relative to start; -1 if it never did.
func tripTime(log string, start time.Time) time.Duration {
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "msg=breaker") || !strings.Contains(line, "to=open") || !strings.Contains(line, "from=closed") {
			continue
		}
		ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		t, err := time.Parse(time.RFC3339Nano, ts)
		if err == nil {
			return t.Sub(start)
		}
	}
	return -1
}
