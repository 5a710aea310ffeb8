package main

import (
	"context"
	"fmt"
	"time"

	"dnsproxi/exercises/fakeupstream"
)

// drillFailover: two upstreams, sequential, a breaker each. The first dies
// silently and heals; then both die, and the retry budget keeps the
// retries from becoming a storm.
func drillFailover(r *rig) error {
	second, err := fakeupstream.Start("127.0.0.1:0")
	if err != nil {
		return err
	}
	defer second.Close()
	if err := failoverMoves(r, second); err != nil {
		return err
	}
	r.stopProxy()
	return failoverNoStorm(r, second)
}

// failoverEnv is the drill's configuration: both upstreams, sequential,
// breakers at 50% of MIN_SAMPLES=20, and the given retry budget.
func (r *rig) failoverEnv(second *fakeupstream.Server, timeout, coolOff time.Duration, budget int) map[string]string {
	return map[string]string{
		"DNS_UPSTREAM":          r.up.Addr() + "," + second.Addr(),
		"DNS_UPSTREAM_POLICY":   "sequential",
		"DNS_BREAKER_THRESHOLD": "50", "DNS_BREAKER_MIN_SAMPLES": "20",
		"DNS_UPSTREAM_TIMEOUT": timeout.String(), "DNS_BREAKER_COOLOFF": coolOff.String(),
		"DNS_RETRY_BUDGET": fmt.Sprint(budget),
	}
}

// failoverMoves: healthy, the first blackholed, the first healed.
func failoverMoves(r *rig, second *fakeupstream.Server) error {
	timeout, coolOff := r.dur(time.Second), r.dur(2*time.Second)
	healthy, dead, healed := r.dur(2*time.Second), r.dur(5*time.Second), r.dur(5*time.Second)
	rate := r.per(50)
	r.up.SetMode(fakeupstream.OK)
	second.SetMode(fakeupstream.OK)
	if err := r.startProxy(r.failoverEnv(second, timeout, coolOff, 100)); err != nil {
		return err
	}
	first := r.up.Addr()
	r.printf("failover: upstreams %s (first) and %s, sequential; breakers 50%% of MIN_SAMPLES=20,\n", first, second.Addr())
	r.printf("  upstream timeout %s, hedge %s (a quarter), cool-off %s; DNS_RETRY_BUDGET=100 here, so that\n", secs(timeout), secs(timeout/4), secs(coolOff))
	r.printf("  every query may hedge; %g queries/s from 4 clients\n\n", rate)

	// A healthy first upstream slower than the hedge delay (on a loaded
	// machine, now and then) is hedged to the second: the second may then
	// receive those hedges, and nothing else, while the first is healthy.
	// A hedge is owed only to a first attempt out for the hedge delay: the
	// proxy's own measure of the first's attempts (past half the delay, a
	// histogram bucket, for a reader that stalled between reading the clock
	// and the reply) bounds them, so that a hedge sent early is caught. An
	// attempt is measured when it ends, by its deadline: a phase is read
	// once every packet the first received is measured (or 4 timeouts on).
	slowBucket := fmt.Sprintf(`dnsproxi_upstream_duration_seconds_bucket{upstream="%s",le="%g"}`, r.up.Addr(), (timeout / 8).Seconds())
	attempts := fmt.Sprintf(`dnsproxi_upstream_duration_seconds_count{upstream="%s"}`, r.up.Addr())
	type reading struct{ hedges, slowFirst, measured int64 }
	read := func() reading {
		s := r.scrape()
		return reading{int64(s.Get(`dnsproxi_retries_total{reason="hedge"}`)), int64(s.Get(attempts) - s.Get(slowBucket)), int64(s.Get(attempts))}
	}
	type phase struct {
		name                string
		res                 summary
		firstPkts, scndPkts int64
		hedges, slowFirst   int64
	}
	var phases []phase
	run := func(name string, span time.Duration) {
		f0, s0, r0 := r.up.Total(), second.Total(), read()
		res := summarize(load(r.proxy.Addr, int(span.Seconds()*rate), 4, span, 4*timeout, 1))
		first := r.up.Total() - f0
		r1 := read()
		for end := time.Now().Add(4 * timeout); r1.measured-r0.measured < first && time.Now().Before(end); r1 = read() {
			time.Sleep(10 * time.Millisecond)
		}
		phases = append(phases, phase{name, res, first, second.Total() - s0, r1.hedges - r0.hedges, r1.slowFirst - r0.slowFirst})
	}
	run("both healthy", healthy)
	r.up.SetMode(fakeupstream.Blackhole)
	run("first blackholed", dead)
	s := r.scrape()
	tripped := s.TransitionsOf(first, "closed", "open")
	probesDead := s.TransitionsOf(first, "open", "half-open")
	r.up.SetMode(fakeupstream.OK)
	run("first healed", healed)
	// Once closed again, the first takes everything: a last stretch shows it.
	run("after the heal", r.dur(time.Second))
	s = r.scrape()

	r.printf("  %-17s %9s %9s %9s %9s %8s %8s\n", "phase", "answered", "p50", "p99", "SERVFAIL", "→first", "→second")
	for _, p := range phases {
		r.printf("  %-17s %8.1f%% %9s %9s %9d %8d %8d\n", p.name, 100*float64(p.res.NoError)/float64(max(p.res.Total, 1)),
			secs(p.res.P50), secs(p.res.P99), p.res.ServFail, p.firstPkts, p.scndPkts)
	}
	r.printf("\n  first upstream's breaker: closed→open %d, open→half-open %d (probes), half-open→closed %d; hedges %d\n",
		s.TransitionsOf(first, "closed", "open"), s.TransitionsOf(first, "open", "half-open"),
		s.TransitionsOf(first, "half-open", "closed"), int(s.Get(`dnsproxi_retries_total{reason="hedge"}`)))
	r.printf("\n  Notice: the dead first upstream never made a client wait its %s timeout: each query it held\n", secs(timeout))
	r.printf("  was hedged to the second after %s, and once its breaker tripped the second took the queries\n", secs(timeout/4))
	r.printf("  first. While open it got nothing but one probe per cool-off; healed, one probe closed it and\n")
	r.printf("  the traffic came back.\n\n")

	dp, hp, after := phases[1], phases[2], phases[3]
	r.numbers = map[string]int{"dead_answered": dp.res.NoError, "dead_total": dp.res.Total, "tripped": tripped,
		"probes_dead": probesDead, "closed_again": s.TransitionsOf(first, "half-open", "closed"),
		"after_first": int(after.firstPkts), "after_second": int(max(after.scndPkts-after.hedges, 0)), "healed_answered": hp.res.NoError}
	r.expect(phases[0].scndPkts <= phases[0].hedges && phases[0].hedges <= phases[0].slowFirst,
		"the second upstream received %d packets while the first was healthy, want none but the hedges (%d) of first attempts out past %s (%d)",
		phases[0].scndPkts, phases[0].hedges, secs(timeout/8), phases[0].slowFirst)
	r.expect(float64(dp.res.NoError) >= 0.97*float64(dp.res.Total), "first blackholed: %d of %d answered, want ≥ 97%%", dp.res.NoError, dp.res.Total)
	r.expect(dp.res.P99 < timeout, "first blackholed: p99 %s, want below the %s timeout", secs(dp.res.P99), secs(timeout))
	r.expect(tripped == 1, "the first upstream's breaker opened %d times while dead, want 1", tripped)
	r.expect(probesDead <= int(dead/coolOff)+1, "%d probes in %s of cool-offs of %s: more than one per cool-off", probesDead, secs(dead), secs(coolOff))
	r.expect(s.TransitionsOf(first, "half-open", "closed") == 1, "the healed first upstream's breaker did not close")
	r.expect(after.scndPkts <= after.hedges && after.hedges <= after.slowFirst && after.firstPkts > 0, "after the heal: first %d, second %d packets (%d hedges); want everything at the first but hedges",
		after.firstPkts, after.scndPkts, after.hedges)
	r.expect(hp.res.NoError == hp.res.Total, "first healed: %d of %d answered", hp.res.NoError, hp.res.Total)
	return nil
}

// storm is one sample of the no-storm run: when, the packets both
// upstreams received so far, and whether both breakers were open.
type storm struct {
	at       time.Duration
	packets  int64
	bothOpen bool
}

// failoverNoStorm: both upstreams dead under DNS_RETRY_BUDGET=10.
func failoverNoStorm(r *rig, second *fakeupstream.Server) error {
	timeout, coolOff, span := r.dur(time.Second), r.dur(2*time.Second), r.dur(6*time.Second)
	rate := r.per(50)
	r.up.SetMode(fakeupstream.Blackhole)
	second.SetMode(fakeupstream.Blackhole)
	p0 := r.up.Total() + second.Total()
	if err := r.startProxy(r.failoverEnv(second, timeout, coolOff, 10)); err != nil {
		return err
	}
	first := r.up.Addr()
	r.printf("  both dead, a fresh proxy with DNS_RETRY_BUDGET=10 (floor 3 a second): %g queries/s for %s\n\n", rate, secs(span))
	start := time.Now()
	samples := r.watchStorm(start, span, func() int64 { return r.up.Total() + second.Total() - p0 },
		func(s Scrape) bool {
			return s.BreakerStateOf(first) != "closed" && s.BreakerStateOf(second.Addr()) != "closed"
		})
	res := load(r.proxy.Addr, int(span.Seconds()*rate), 4, span, 4*timeout, 1)
	time.Sleep(timeout) // the last attempts end
	ss := <-samples
	s := r.scrape()

	tripAt, tripPackets := time.Duration(-1), int64(0)
	for _, x := range ss {
		if x.bothOpen {
			tripAt, tripPackets = x.at, x.packets
			break
		}
	}
	total := r.up.Total() + second.Total() - p0
	before := 0
	for _, x := range res {
		if tripAt >= 0 && x.sent < tripAt {
			before++
		}
	}
	after := len(res) - before
	floor := 3 / rate // the floor's share at this rate, at most
	bound := 1.1 + floor + 0.01
	ratio := float64(tripPackets) / float64(max(before, 1))
	probes := s.TransitionsOf(first, "open", "half-open") + s.TransitionsOf(second.Addr(), "open", "half-open")
	r.printf("  until both breakers were open (%s): %d queries, %d upstream packets: %.3f per query (bound %.3f)\n",
		secs(tripAt), before, tripPackets, ratio, bound)
	r.printf("  after: %d queries, %d upstream packets (%d probes); hedges %d, refused by the budget %d\n",
		after, total-tripPackets, probes, int(s.Get(`dnsproxi_retries_total{reason="hedge"}`)),
		int(s.Get("dnsproxi_retry_budget_exhausted_total")))
	r.printf("\n  Notice: with a hedge on every query a dead pair would get 2 packets per query; the budget held\n")
	r.printf("  it to a tenth more than the queries themselves, and the breakers then cut it to the probes.\n")
	r.printf("  That is the retry storm that did not happen.\n")

	r.numbers["storm_ratio_milli"] = int(ratio * 1000)
	r.numbers["storm_after_packets"] = int(total - tripPackets)
	r.numbers["storm_probes"] = probes
	r.expect(tripAt >= 0, "the breakers were never both open")
	r.expect(ratio <= bound, "%.3f upstream packets per query before the trip, want ≤ %.3f", ratio, bound)
	// After the trip, only probes reach the dead pair: a hedge finds every breaker open.
	r.expect(total-tripPackets <= int64(probes), "%d packets after both breakers opened, for %d probes", total-tripPackets, probes)
	return nil
}

// watchStorm samples /metrics and the upstreams' packet count until d has
// passed; open says whether a scrape shows every breaker open.
func (r *rig) watchStorm(start time.Time, d time.Duration, packets func() int64, open func(Scrape) bool) <-chan []storm {
	out := make(chan []storm, 1)
	go func() {
		var ss []storm
		for time.Since(start) < d {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			s, err := r.proxy.scrape(ctx)
			cancel()
			if err == nil { // the packets and the time as of the scrape's end: what it saw, at the latest
				ss = append(ss, storm{time.Since(start), packets(), open(s)})
			}
			time.Sleep(r.dur(20 * time.Millisecond))
		}
		out <- ss
	}()
	return out
}
