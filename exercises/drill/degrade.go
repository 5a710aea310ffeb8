package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/exercises/fakeupstream"
)

// degradeRun is what one run of the degrade drill saw, phase by phase.
type degradeRun struct {
	name                    string
	prime, first            staleSummary
	known, unknown          staleSummary // during the outage
	outagePackets, probes   int          // what the upstream received during the outage; half-open probes
	healedNew, healedKnown  staleSummary
	flushed                 staleSummary
	firstSent, refreshesOut int // upstream packets in the first round; refreshes refused there
}

// staleSummary is a summary with what marks an answer stale: every
// record's TTL 30 and the Extended DNS Error 3 (Stale Answer).
type staleSummary struct {
	summary
	Stale int
}

func (s staleSummary) String() string {
	return fmt.Sprintf("%d NOERROR (%d stale: TTL 30, EDE 3), %d SERVFAIL, %d unanswered; %d within 10ms; p50 %v",
		s.NoError, s.Stale, s.ServFail, s.Unanswered, s.Within10ms, s.P50.Round(time.Millisecond))
}

// askStale asks each of names once, spread evenly over d, with EDNS (so a
// stale answer can carry its EDE), each waiting at most timeout.
func askStale(addr string, names []string, d, timeout time.Duration) staleSummary {
	results := make([]result, len(names))
	stale := make([]bool, len(names))
	var wg sync.WaitGroup
	start := time.Now()
	gap := d / time.Duration(max(len(names), 1))
	for i, name := range names {
		if wait := time.Until(start.Add(gap * time.Duration(i))); wait > 0 {
			time.Sleep(wait)
		}
		wg.Go(func() {
			q := new(dns.Msg)
			q.SetQuestion(name, dns.TypeA)
			q.SetEdns0(1232, false)
			c := &dns.Client{Net: "udp", Timeout: timeout}
			sent := time.Now()
			resp, _, err := c.Exchange(q, addr)
			r := result{sent: sent.Sub(start), latency: time.Since(sent)}
			if err == nil {
				r.answered, r.rcode = true, resp.Rcode
				stale[i] = isStale(resp)
			}
			results[i] = r
		})
	}
	wg.Wait()
	s := staleSummary{summary: summarize(results)}
	for _, st := range stale {
		if st {
			s.Stale++
		}
	}
	return s
}

// isStale reports whether m is a stale answer: records, each with TTL 30,
// and EDE 3 in its OPT.
func isStale(m *dns.Msg) bool {
	if len(m.Answer) == 0 {
		return false
	}
	for _, rr := range m.Answer {
		if rr.Header().Ttl != 30 {
			return false
		}
	}
	if opt := m.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if e, ok := o.(*dns.EDNS0_EDE); ok && e.InfoCode == dns.ExtendedErrorCodeStaleAnswer {
				return true
			}
		}
	}
	return false
}

// names returns n names under prefix.
func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%d.example.com.", prefix, i)
	}
	return out
}

// flushCache posts to the proxy's /cache/flush.
func (r *rig) flushCache() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	url := strings.TrimSuffix(r.proxy.Metrics, "/metrics") + "/cache/flush"
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST %s: %s", url, resp.Status)
	}
	return nil
}

// drillDegrade: known names keep resolving, stale, while the upstream is
// dead; then the same run without the cache.
func drillDegrade(r *rig) error {
	const known, unknownN, newN = 50, 20, 20
	timeout, staleWait, coolOff := r.dur(time.Second), r.dur(400*time.Millisecond), r.dur(2*time.Second)
	outage := 3 * coolOff
	ttl := time.Second // the smallest TTL there is: not scaled
	r.printf("degrade: %d names primed with a %s TTL (DNS_CACHE_MAX_TTL=1s), then the upstream is blackholed.\n", known, secs(ttl))
	r.printf("  Upstream timeout %s; breaker 50%% of the last 20, MIN_SAMPLES=10, cool-off %s;\n", secs(timeout), secs(coolOff))
	r.printf("  with the cache: DNS_CACHE_STALE=1h, DNS_CACHE_STALE_WAIT=%s. The same run without the cache follows.\n\n", secs(staleWait))

	var runs []degradeRun
	for _, withCache := range []bool{true, false} {
		env := map[string]string{
			"DNS_UPSTREAM_TIMEOUT": timeout.String(), "DNS_BREAKER_THRESHOLD": "50", "DNS_BREAKER_MIN_SAMPLES": "10",
			"DNS_BREAKER_WINDOW": "20", "DNS_BREAKER_COOLOFF": coolOff.String(),
		}
		run := degradeRun{name: "without cache"}
		if withCache {
			run.name = "with cache"
			env["DNS_CACHE_SIZE"], env["DNS_CACHE_MAX_TTL"] = "1MB", "1s"
			env["DNS_CACHE_STALE"], env["DNS_CACHE_STALE_WAIT"] = "1h", staleWait.String()
		}
		r.up.SetMode(fakeupstream.OK)
		if err := r.startProxy(env); err != nil {
			return err
		}
		r.printf("  -- %s\n", run.name)
		start := time.Now()
		at := func() string { return fmt.Sprintf("%7s", secs(time.Since(start))) }
		knownNames := names("known", known)

		run.prime = askStale(r.proxy.Addr, knownNames, 0, 4*timeout)
		r.printf("  %s  healthy: %d names → %s\n", at(), known, run.prime)
		time.Sleep(ttl + ttl/2)
		r.up.SetMode(fakeupstream.Blackhole)

		before := r.up.Total()
		run.first = askStale(r.proxy.Addr, knownNames, r.dur(3*time.Second), 4*timeout)
		time.Sleep(timeout) // the last refreshes reach their deadline
		s := r.scrape()
		run.firstSent = int(r.up.Total() - before)
		run.refreshesOut = int(s.Get(`dnsproxi_cache_refreshes_total{result="refused"}`))
		r.printf("  %s  blackhole; the %d names again over %s → %s\n", at(), known, secs(r.dur(3*time.Second)), run.first)
		r.printf("           the upstream received %d of them; the breaker is %s (opened %d times)\n",
			run.firstSent, s.BreakerState(), s.Transitions("closed", "open"))

		before, probesBefore := r.up.Total(), s.Transitions("open", "half-open")
		var wg sync.WaitGroup
		wg.Go(func() {
			var all staleSummary
			for range 3 {
				k := askStale(r.proxy.Addr, knownNames, outage/3, 4*timeout)
				all.summary = add(all.summary, k.summary)
				all.Stale += k.Stale
			}
			run.known = all
		})
		wg.Go(func() { run.unknown = askStale(r.proxy.Addr, names("unknown", unknownN), outage, 4*timeout) })
		wg.Wait()
		time.Sleep(timeout) // a probe sent last reaches its deadline
		s = r.scrape()
		run.outagePackets, run.probes = int(r.up.Total()-before), s.Transitions("open", "half-open")-probesBefore
		r.printf("  %s  outage, %s: the %d names 3 times → %s\n", at(), secs(outage), known, run.known)
		r.printf("           %d names never asked before → %s\n", unknownN, run.unknown)
		r.printf("           the upstream received %d packets: %d half-open probes, one each time the cool-off ends\n", run.outagePackets, run.probes)

		r.up.SetMode(fakeupstream.OK)
		time.Sleep(coolOff)
		run.healedNew = askStale(r.proxy.Addr, names("new", newN), r.dur(time.Second), 4*timeout)
		run.healedKnown = askStale(r.proxy.Addr, knownNames, 0, 4*timeout)
		s = r.scrape()
		r.printf("  %s  healed; after a cool-off, %d new names → %s; breaker %s\n", at(), newN, run.healedNew, s.BreakerState())
		r.printf("           the %d names → %s\n", known, run.healedKnown)
		if withCache {
			if err := r.flushCache(); err != nil {
				r.expect(false, "flush: %v", err)
			}
			run.flushed = askStale(r.proxy.Addr, knownNames, 0, 4*timeout)
			r.printf("           POST /cache/flush; the %d names → %s\n", known, run.flushed)
		}
		r.printf("\n")
		r.outcomesWith(r.scrape(), "cached", "stale")
		r.printf("\n")
		runs = append(runs, run)
		r.stopProxy()
	}
	with, without := runs[0], runs[1]
	r.printf("  side by side                                 %-16s %s\n", with.name, without.name)
	row := func(what string, a, b int) { r.printf("  %-44s %-16d %d\n", what, a, b) }
	row("first round: known names answered NOERROR", with.first.NoError, without.first.NoError)
	row("  of which within 10ms", with.first.Within10ms, without.first.Within10ms)
	row("outage: known names answered NOERROR", with.known.NoError, without.known.NoError)
	row("  stale (TTL 30, EDE 3) within 10ms", min(with.known.Stale, with.known.Within10ms), 0)
	row("outage: new names answered SERVFAIL", with.unknown.ServFail, without.unknown.ServFail)
	row("outage: packets to the upstream", with.outagePackets, without.outagePackets)
	row("healed: new names NOERROR", with.healedNew.NoError, without.healedNew.NoError)
	r.printf("\n  Notice: the breaker alone only brings the error forward: without the cache every known\n")
	r.printf("  name fails, fast. With it, a refresh is tried first; the client waits at most the\n")
	r.printf("  stale-wait timer (%s), or nothing once the breaker is open or the name's refresh failed\n", secs(staleWait))
	r.printf("  (30 s recheck), and gets the last answer marked stale. Names never seen still get SERVFAIL,\n")
	r.printf("  and the upstream sees one probe per cool-off either way: no refresh storm. After healing,\n")
	r.printf("  names whose refresh failed stay stale until their 30 s recheck passes (RFC 8767), or a flush.\n")

	r.numbers = map[string]int{
		"primed": with.prime.NoError, "first_ok": with.first.NoError, "first_stale": with.first.Stale,
		"known_asked": with.known.Total, "known_stale": with.known.Stale, "known_fast": with.known.Within(staleWait / 2),
		"unknown_servfail": with.unknown.ServFail, "outage_packets": with.outagePackets, "probes": with.probes,
		"healed_new_ok": with.healedNew.NoError, "flushed_fresh": with.flushed.NoError - with.flushed.Stale,
		"nocache_first_ok": without.first.NoError, "nocache_known_ok": without.known.NoError,
		"nocache_healed_ok": without.healedNew.NoError,
	}
	maxProbes := int(outage/coolOff) + 2
	r.expect(with.prime.NoError == known && without.prime.NoError == known, "priming: %s / %s", with.prime, without.prime)
	r.expect(with.first.NoError == known && with.first.Stale == known, "first round with the cache: %s, want %d stale", with.first, known)
	r.expect(with.known.Stale == with.known.Total, "outage with the cache: %s, want every known name stale", with.known)
	r.expect(with.known.Within(staleWait/2) >= with.known.Total-with.probes,
		"outage with the cache: %d of %d within %s (half the stale-wait timer), want all but the %d that took a probe",
		with.known.Within(staleWait/2), with.known.Total, secs(staleWait/2), with.probes)
	r.expect(with.unknown.ServFail == unknownN, "new names in the outage: %s, want SERVFAIL", with.unknown)
	r.expect(with.outagePackets == with.probes && with.probes <= maxProbes,
		"the upstream received %d packets in the outage for %d probes (at most %d): a refresh storm?", with.outagePackets, with.probes, maxProbes)
	r.expect(with.healedNew.NoError == newN && without.healedNew.NoError == newN, "after healing: %s / %s", with.healedNew, without.healedNew)
	r.expect(with.flushed.NoError == known && with.flushed.Stale == 0, "after the flush: %s, want %d fresh", with.flushed, known)
	r.expect(without.first.NoError == 0 && without.known.NoError == 0, "without the cache a dead upstream answered: %s / %s", without.first, without.known)
	return nil
}

// add sums two summaries' counts (not their percentiles, which are the
// larger of the two).
func add(a, b summary) summary {
	return summary{Total: a.Total + b.Total, NoError: a.NoError + b.NoError, ServFail: a.ServFail + b.ServFail,
		Refused: a.Refused + b.Refused, Other: a.Other + b.Other, Unanswered: a.Unanswered + b.Unanswered,
		Within10ms: a.Within10ms + b.Within10ms, Within100ms: a.Within100ms + b.Within100ms,
		P50: max(a.P50, b.P50), P99: max(a.P99, b.P99), lat: merged(a.lat, b.lat)}
}

// merged is two sorted lists of latencies as one, sorted.
func merged(a, b []time.Duration) []time.Duration {
	out := append(append(make([]time.Duration, 0, len(a)+len(b)), a...), b...)
	slices.Sort(out)
	return out
}

// outcomesWith prints the outcome table with extra outcomes.
func (r *rig) outcomesWith(s Scrape, extra ...string) {
	r.printf("  %-15s %6s\n", "outcome", "count")
	for _, o := range append([]string{"forwarded", "breaker_open", "upstream_error"}, extra...) {
		r.printf("  %-15s %6d\n", o, s.Outcome(o))
	}
}
