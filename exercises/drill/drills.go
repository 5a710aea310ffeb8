package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"dnsproxi/exercises/fakeupstream"
)

// rig is one drill's fake upstream and, once started, its proxy.
type rig struct {
	out   io.Writer
	bin   string
	scale float64 // 1: the chapter's timings; smaller: the same drill, faster
	up    *fakeupstream.Server
	proxy *proxyProcess

	failures []string
	numbers  map[string]int // key figures, for the drill's tests
}

// dur scales a chapter duration.
func (r *rig) dur(d time.Duration) time.Duration { return time.Duration(float64(d) * r.scale) }

// per scales a chapter rate (per second) the other way, so counts stay the same.
func (r *rig) per(rate float64) float64 { return rate / r.scale }

func (r *rig) printf(format string, args ...any) { fmt.Fprintf(r.out, format, args...) }

// expect records a failed expectation when ok is false.
func (r *rig) expect(ok bool, format string, args ...any) {
	if !ok {
		msg := fmt.Sprintf(format, args...)
		r.failures = append(r.failures, msg)
		r.printf("  ✗ %s\n", msg)
	}
}

func (r *rig) startProxy(env map[string]string) error {
	if _, ok := env["DNS_UPSTREAM"]; !ok {
		env["DNS_UPSTREAM"] = r.up.Addr()
	}
	p, err := startProxy(r.bin, env)
	if err != nil {
		return err
	}
	r.proxy = p
	return nil
}

func (r *rig) stopProxy() {
	if r.proxy != nil {
		r.proxy.Stop()
		r.proxy = nil
	}
}

func (r *rig) scrape() Scrape {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := r.proxy.scrape(ctx)
	if err != nil {
		r.expect(false, "reading /metrics: %v", err)
		return Scrape{}
	}
	return s
}

// scrapeCounted scrapes until the proxy has counted at least n queries,
// for at most 2 s: a client can read its answer a moment before the proxy
// counts its outcome, so a scrape taken as the last answer arrives may miss
// it. It returns the last scrape either way; the caller's checks then say
// what is missing.
func (r *rig) scrapeCounted(n int) Scrape {
	deadline := time.Now().Add(2 * time.Second)
	for {
		s := r.scrape()
		if s.Queries() >= n || time.Now().After(deadline) {
			return s
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// outcomes prints the outcome table of one scrape.
func (r *rig) outcomes(s Scrape) {
	r.printf("  %-15s %6s\n", "outcome", "count")
	for _, o := range []string{"forwarded", "rate_limited", "breaker_open", "upstream_error", "overloaded"} {
		r.printf("  %-15s %6d\n", o, s.Outcome(o))
	}
}

func secs(d time.Duration) string { return d.Round(time.Millisecond).String() }

// drillRateLimit: a blackholed upstream behind DNS_RATE_LIMIT=5,5, and
// clients that give up after 1 s and try again, as dig does.
func drillRateLimit(r *rig) error {
	rate := r.per(5)
	timeout, clientTimeout, span := r.dur(2*time.Second), r.dur(time.Second), r.dur(8*time.Second)
	r.up.SetMode(fakeupstream.Blackhole)
	if err := r.startProxy(map[string]string{
		"DNS_RATE_LIMIT":       fmt.Sprintf("%g,5", rate),
		"DNS_UPSTREAM_TIMEOUT": timeout.String(),
		"DNS_BREAKER_COOLOFF":  (timeout + time.Second).String(),
	}); err != nil {
		return err
	}
	r.printf("ratelimit: blackholed upstream, DNS_RATE_LIMIT=%g,5, upstream timeout %s;\n", rate, secs(timeout))
	r.printf("  40 queries over %s from 4 clients, each waiting %s and trying 3 times (like dig)\n\n", secs(span), secs(clientTimeout))
	start := time.Now()
	res := summarize(load(r.proxy.Addr, 40, 4, span, clientTimeout, 3))
	elapsed := time.Since(start)
	time.Sleep(timeout) // let the last exchanges reach their deadline
	s := r.scrape()
	r.outcomes(s)
	arrived := s.Outcome("forwarded") + s.Outcome("rate_limited") + s.Outcome("upstream_error")
	quota := 5 + rate*elapsed.Seconds()
	r.printf("\n  clients: %s\n", res)
	r.printf("  packets that reached the proxy: %d (40 queries × up to 3 tries); upstream received %d\n", arrived, r.up.Total())
	r.printf("  the bucket's quota over the %s the clients kept trying: 5 + %g/s × %.1fs = %.0f\n\n", secs(elapsed), rate, elapsed.Seconds(), quota)
	r.printf("  Notice: 40 queries over %s is exactly the rate, and the burst adds 5 more, so the\n", secs(span))
	r.printf("  bucket alone would pass them all (quota 40 + burst 5). What fills it is the deadline:\n")
	r.printf("  the upstream holds every query for %s, the clients give up after %s and send again, so\n", secs(timeout), secs(clientTimeout))
	r.printf("  each query arrives up to 3 times. The slow upstream, not the clients, is the bottleneck;\n")
	r.printf("  nobody gets an answer in time, and the gate sheds the retries beyond the rate.\n")

	r.numbers = map[string]int{"rate_limited": s.Outcome("rate_limited"), "upstream_error": s.Outcome("upstream_error"),
		"forwarded": s.Outcome("forwarded"), "arrived": arrived, "upstream": int(r.up.Total()),
		"coalesced": int(s.Get("dnsproxi_coalesced_total"))}
	r.expect(s.Outcome("rate_limited") > 0, "no query was rate_limited")
	r.expect(s.Outcome("forwarded") == 0, "%d forwarded from a blackholed upstream", s.Outcome("forwarded"))
	r.expect(float64(s.Outcome("upstream_error")) <= quota+1, "the gate let %d through, over its quota of %.0f", s.Outcome("upstream_error"), quota)
	coalesced := int(s.Get("dnsproxi_coalesced_total")) // retries that joined their query still in flight
	r.expect(int(r.up.Total())+coalesced == s.Outcome("upstream_error"), "upstream received %d (+%d coalesced), want only the %d that passed the gate",
		r.up.Total(), coalesced, s.Outcome("upstream_error"))
	r.expect(arrived > 40, "only %d packets arrived: the clients did not retry", arrived)
	return nil
}

// drillBreaker: blackhole → trip → open (the upstream sees nothing) → heal → probe → closed.
func drillBreaker(r *rig) error {
	// The cool-off is never under a second: the open phase must come
	// before it ends, and a loaded machine (a -race run beside other
	// tests) stretched the quick form's trip from 0.4 s to nearly 1 s.
	timeout, coolOff := r.dur(500*time.Millisecond), max(r.dur(2*time.Second), time.Second)
	r.up.SetMode(fakeupstream.Blackhole)
	if err := r.startProxy(map[string]string{
		"DNS_BREAKER_THRESHOLD": "50", "DNS_BREAKER_MIN_SAMPLES": "20",
		"DNS_UPSTREAM_TIMEOUT": timeout.String(), "DNS_BREAKER_COOLOFF": coolOff.String(),
	}); err != nil {
		return err
	}
	r.printf("breaker: DNS_BREAKER_THRESHOLD=50, MIN_SAMPLES=20, upstream timeout %s, cool-off %s\n\n", secs(timeout), secs(coolOff))
	start := time.Now()
	at := func() string { return secs(time.Since(start)) }

	trip := summarize(load(r.proxy.Addr, 30, 5, r.dur(1500*time.Millisecond), 4*timeout, 1))
	s := r.scrape()
	tripped := s.Outcome("upstream_error")
	r.printf("  %s  blackhole: 30 queries → %d timed out at the upstream, %d refused at once; breaker %s\n",
		at(), tripped, s.Outcome("breaker_open"), s.BreakerState())
	r.printf("        clients: %s\n", trip)
	r.expect(s.BreakerState() == "open", "breaker %s after the blackhole, want open", s.BreakerState())
	r.expect(tripped >= 20, "only %d upstream errors before the trip, want at least MinSamples=20", tripped)

	before := r.up.Total()
	open := summarize(load(r.proxy.Addr, 5, 1, 0, 4*timeout, 1))
	s = r.scrape()
	r.printf("  %s  open: 5 more queries → %d SERVFAIL within 10ms; the upstream received %d packets\n",
		at(), open.Within10ms, r.up.Total()-before)
	r.expect(open.ServFail == 5 && open.Within(timeout/2) == 5, "open breaker: %s, want 5 SERVFAILs within %s (half the timeout)", open, secs(timeout/2))
	r.expect(r.up.Total() == before, "the upstream received %d packets while open, want 0", r.up.Total()-before)

	r.up.SetMode(fakeupstream.OK)
	r.printf("  %s  the upstream heals; waiting out the cool-off\n", at())
	time.Sleep(coolOff)
	probe := summarize(load(r.proxy.Addr, 1, 1, 0, 4*timeout, 1))
	s = r.scrape()
	r.printf("  %s  one probe → %d NOERROR; transitions open→half-open %d, half-open→closed %d; breaker %s\n",
		at(), probe.NoError, s.Transitions("open", "half-open"), s.Transitions("half-open", "closed"), s.BreakerState())
	r.expect(probe.NoError == 1 && s.BreakerState() == "closed", "the probe did not close the breaker (%s)", s.BreakerState())
	r.expect(r.up.Total() == before+1, "upstream received %d packets for the probe, want exactly 1", r.up.Total()-before)

	flow := summarize(load(r.proxy.Addr, 20, 4, r.dur(500*time.Millisecond), 4*timeout, 1))
	r.printf("  %s  closed: 20 queries → %d NOERROR\n\n", at(), flow.NoError)
	r.expect(flow.NoError == 20, "after closing: %s", flow)
	s = r.scrape()
	r.outcomes(s)
	r.printf("\n  Notice: after the trip a query costs microseconds instead of the %s deadline, and the\n", secs(timeout))
	r.printf("  upstream sees no packet at all until the single probe; one good answer closes it.\n")
	r.numbers = map[string]int{"trip_errors": tripped, "open_fast": open.Within(timeout / 2), "probe_packets": int(r.up.Total() - before - 20),
		"closed_ok": flow.NoError}
	return nil
}

// drillFlap: an upstream that is healthy and dead in turns.
func drillFlap(r *rig) error {
	timeout, coolOff, period, span := r.dur(500*time.Millisecond), r.dur(time.Second), r.dur(3*time.Second), r.dur(24*time.Second)
	r.up.SetFlapPeriod(period)
	r.up.SetMode(fakeupstream.Flap)
	if err := r.startProxy(map[string]string{
		"DNS_BREAKER_THRESHOLD": "50", "DNS_BREAKER_MIN_SAMPLES": "10", "DNS_BREAKER_WINDOW": "20",
		"DNS_UPSTREAM_TIMEOUT": timeout.String(), "DNS_BREAKER_COOLOFF": coolOff.String(),
	}); err != nil {
		return err
	}
	n := int(span.Seconds() * r.per(20))
	r.printf("flap: the upstream is healthy %s, then dead %s, in turns; breaker 50%%, MIN_SAMPLES=10, WINDOW=20,\n", secs(period), secs(period))
	r.printf("  upstream timeout %s, cool-off %s; %d queries over %s from 4 clients\n\n", secs(timeout), secs(coolOff), n, secs(span))
	start := time.Now()
	timeline := r.watchState(start, span+timeout)
	res := summarize(load(r.proxy.Addr, n, 4, span, 4*timeout, 1))
	r.printf("  breaker state over time (sampled):\n")
	for _, line := range <-timeline {
		r.printf("    %s\n", line)
	}
	s := r.scrape()
	r.printf("\n")
	r.outcomes(s)
	r.printf("\n  transitions: closed→open %d, open→half-open %d, half-open→open %d, half-open→closed %d\n",
		s.Transitions("closed", "open"), s.Transitions("open", "half-open"), s.Transitions("half-open", "open"), s.Transitions("half-open", "closed"))
	r.printf("  clients: %s\n", res)
	r.printf("  spared a timeout: %d queries answered at once by the open breaker instead of waiting %s each\n\n", s.Outcome("breaker_open"), secs(timeout))
	r.printf("  Notice: each dead phase costs about MIN_SAMPLES timeouts before the trip, then nothing;\n")
	r.printf("  each healthy phase is found by one probe per cool-off. The breaker follows the upstream.\n")
	r.numbers = map[string]int{"opened": s.Transitions("closed", "open"), "closed_again": s.Transitions("half-open", "closed"),
		"spared": s.Outcome("breaker_open"), "forwarded": s.Outcome("forwarded")}
	r.expect(s.Transitions("closed", "open") >= 2, "the breaker opened %d times over several dead phases, want at least 2", s.Transitions("closed", "open"))
	r.expect(s.Transitions("half-open", "closed") >= 1, "the breaker never closed again in a healthy phase")
	r.expect(s.Outcome("breaker_open") > s.Outcome("upstream_error"), "spared %d, fewer than the %d timeouts paid", s.Outcome("breaker_open"), s.Outcome("upstream_error"))
	return nil
}

// watchState samples the breaker's state until d has passed and returns the changes it saw.
func (r *rig) watchState(start time.Time, d time.Duration) <-chan []string {
	out := make(chan []string, 1)
	go func() {
		var lines []string
		last := ""
		for time.Since(start) < d {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			s, err := r.proxy.scrape(ctx)
			cancel()
			if err == nil && s.BreakerState() != last {
				last = s.BreakerState()
				lines = append(lines, fmt.Sprintf("%7s  %s", secs(time.Since(start)), last))
			}
			time.Sleep(r.dur(100 * time.Millisecond))
		}
		out <- lines
	}()
	return out
}

// drillSlow: the upstream slows from 5 ms to 1.5 s, without and with the breaker.
func drillSlow(r *rig) error {
	timeout, coolOff := r.dur(time.Second), r.dur(2*time.Second)
	fast, slow := r.dur(5*time.Millisecond), r.dur(1500*time.Millisecond)
	healthy, sick := r.dur(2*time.Second), r.dur(4*time.Second)
	rate := r.per(40)
	r.printf("slow: the upstream answers in %s for %s, then in %s for %s; upstream timeout %s;\n", secs(fast), secs(healthy), secs(slow), secs(sick), secs(timeout))
	r.printf("  %g queries/s from 4 clients. Once without the breaker, once with DNS_BREAKER_THRESHOLD=50.\n\n", rate)
	type run struct {
		name                       string
		sick                       summary
		peakG, peakRSSMB, peakHeld float64
		s                          Scrape
	}
	var runs []run
	for _, withBreaker := range []bool{false, true} {
		env := map[string]string{"DNS_UPSTREAM_TIMEOUT": timeout.String(), "DNS_BREAKER_COOLOFF": coolOff.String()}
		name := "without breaker"
		if withBreaker {
			env["DNS_BREAKER_THRESHOLD"] = "50"
			name = "with breaker"
		}
		r.up.SetDelay(fast)
		r.up.SetMode(fakeupstream.Slow)
		if err := r.startProxy(env); err != nil {
			return err
		}
		peak := r.watchPeak(healthy + sick + timeout)
		load(r.proxy.Addr, int(healthy.Seconds()*rate), 4, healthy, 4*timeout, 1)
		r.up.SetDelay(slow)
		sickRes := summarize(load(r.proxy.Addr, int(sick.Seconds()*rate), 4, sick, 4*timeout, 1))
		p := <-peak
		runs = append(runs, run{name, sickRes, p[0], p[1] / 1e6, p[2], r.scrape()})
		r.stopProxy()
	}
	for _, x := range runs {
		r.printf("  %s, while slow: %s\n", x.name, x.sick)
		r.printf("    outcomes: forwarded %d, upstream_error %d, breaker_open %d; peak in flight %.0f, goroutines %.0f, RSS %.1f MB\n",
			x.s.Outcome("forwarded"), x.s.Outcome("upstream_error"), x.s.Outcome("breaker_open"), x.peakHeld, x.peakG, x.peakRSSMB)
	}
	r.printf("\n  Notice: without the breaker every query in the slow phase waits the full %s and ends in\n", secs(timeout))
	r.printf("  SERVFAIL anyway, holding a place among DNS_MAX_INFLIGHT the whole time (goroutines stay flat:\n")
	r.printf("  a waiting query is an entry in a table, not a goroutine). With it, after MIN_SAMPLES failures\n")
	r.printf("  the clients get their SERVFAIL at once and the upstream gets one probe per cool-off.\n")
	without, with := runs[0], runs[1]
	r.numbers = map[string]int{"fast_without": without.sick.Within100ms, "fast_with": with.sick.Within100ms,
		"breaker_open": with.s.Outcome("breaker_open")}
	r.expect(with.s.Outcome("breaker_open") > 0, "the breaker never opened on a 1.5 s upstream")
	r.expect(without.s.Outcome("breaker_open") == 0, "breaker_open counted with the breaker off")
	r.expect(with.sick.Within100ms > without.sick.Within100ms, "with the breaker %d answered within 100ms, without %d: want more with",
		with.sick.Within100ms, without.sick.Within100ms)
	return nil
}

// watchPeak samples go_goroutines, RSS and the queries in flight until d has
// passed and returns their peaks.
func (r *rig) watchPeak(d time.Duration) <-chan [3]float64 {
	out := make(chan [3]float64, 1)
	start := time.Now()
	go func() {
		var peak [3]float64
		for time.Since(start) < d {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			s, err := r.proxy.scrape(ctx)
			cancel()
			if err == nil {
				peak[0] = max(peak[0], s.Get("go_goroutines"))
				peak[1] = max(peak[1], s.Get("process_resident_memory_bytes"))
				peak[2] = max(peak[2], s.Get("dnsproxi_queries_in_flight"))
			}
			time.Sleep(r.dur(100 * time.Millisecond))
		}
		out <- peak
	}()
	return out
}

// drillOverload: 4 clients offer four times the rate; the bucket shapes what passes.
func drillOverload(r *rig) error {
	rate, burst := r.per(20), int(r.per(10))
	span := 3 * time.Second
	if r.scale < 1 {
		span = time.Second
	}
	offered := int(4 * rate * span.Seconds())
	if err := r.startProxy(map[string]string{"DNS_RATE_LIMIT": fmt.Sprintf("%g,%d", rate, burst)}); err != nil {
		return err
	}
	r.printf("overload: DNS_RATE_LIMIT=%g,%d; 4 clients each send %g queries/s for %s (%d in all, 4× the rate)\n\n", rate, burst, rate, secs(span), offered)
	res := load(r.proxy.Addr, offered, 4, span, r.dur(500*time.Millisecond), 1)
	s := r.scrape()
	r.outcomes(s)
	buckets := 6
	passed := make([]int, buckets)
	sent := make([]int, buckets)
	for _, x := range res {
		i := min(int(x.sent*time.Duration(buckets)/span), buckets-1)
		sent[i]++
		if x.answered {
			passed[i]++
		}
	}
	r.printf("\n  %-14s %8s %8s\n", "sent in", "offered", "passed")
	for i := range buckets {
		from, to := span*time.Duration(i)/time.Duration(buckets), span*time.Duration(i+1)/time.Duration(buckets)
		r.printf("  %5s-%-7s %8d %8d %s\n", secs(from), secs(to), sent[i], passed[i], strings.Repeat("#", passed[i]*40/max(1, sent[i])))
	}
	want := float64(burst) + rate*span.Seconds()
	got := s.Outcome("forwarded")
	r.printf("\n  passed %d; burst + rate × time = %d + %g × %.0fs = %.0f\n\n", got, burst, rate, span.Seconds(), want)
	r.printf("  Notice: the first slice passes the burst on top of the rate, then every slice passes\n")
	r.printf("  the rate and no more, however hard the 4 clients push. What is refused is dropped: the\n")
	r.printf("  upstream never sees it (received %d).\n", r.up.Total())
	r.numbers = map[string]int{"forwarded": got, "rate_limited": s.Outcome("rate_limited"), "first": passed[0], "last": passed[buckets-1]}
	r.expect(float64(got) >= 0.85*want && float64(got) <= want+rate*0.2+2, "passed %d, want about %.0f", got, want)
	r.expect(got+s.Outcome("rate_limited") == offered, "forwarded + rate_limited = %d, want all %d offered", got+s.Outcome("rate_limited"), offered)
	r.expect(int(r.up.Total()) == got, "the upstream received %d, want only the %d that passed", r.up.Total(), got)
	r.expect(passed[0] > passed[buckets-1], "the first slice (%d) did not pass more than the last (%d): where is the burst?", passed[0], passed[buckets-1])
	return nil
}
