package main

import (
	"fmt"
	"sync"
	"time"

	"dnsproxi/exercises/fakeupstream"
)

// drillSlowNames: slow names among answered neighbours leave the breaker
// closed; the same upstream blackholed opens it within MIN_SAMPLES.
func drillSlowNames(r *rig) error {
	// The cool-off only has to outlast the open phase, which nothing here
	// waits out: a long one costs nothing, and a loaded machine (a -race
	// run beside other tests) once took the quick form's 0.4 s before it.
	timeout, coolOff, span := r.dur(500*time.Millisecond), 10*time.Second, r.dur(2*time.Second)
	const minSamples, slowN, neighbourN = 20, 40, 10
	r.up.SetDelay(3 * timeout) // a name under "slow." is answered, but long after the deadline
	r.up.SetMode(fakeupstream.OK)
	if err := r.startProxy(map[string]string{
		"DNS_BREAKER_THRESHOLD": "50", "DNS_BREAKER_MIN_SAMPLES": fmt.Sprint(minSamples),
		"DNS_UPSTREAM_TIMEOUT": timeout.String(), "DNS_BREAKER_COOLOFF": coolOff.String(),
	}); err != nil {
		return err
	}
	r.printf("slownames: DNS_BREAKER_THRESHOLD=50, MIN_SAMPLES=%d, upstream timeout %s; the upstream answers\n", minSamples, secs(timeout))
	r.printf("  every name at once, except names under slow., which it answers only after %s\n\n", secs(3*timeout))
	start := time.Now()
	at := func() string { return secs(time.Since(start)) }

	// Half 1: one client asks only slow names while another is answered.
	var slow, neighbours summary
	var wg sync.WaitGroup
	wg.Go(func() {
		slow = summarize(loadNames(r.proxy.Addr, slowN, 4, span, 4*timeout, 1, func(i int) string {
			return fmt.Sprintf("slow.s%d.example.com.", i)
		}))
	})
	wg.Go(func() {
		neighbours = summarize(load(r.proxy.Addr, neighbourN, 1, span, 4*timeout, 1))
	})
	wg.Wait()
	s := r.scrapeCounted(slowN + neighbourN)
	slowErrors, slowOpened, slowRefused := s.Outcome("upstream_error"), s.Transitions("closed", "open"), s.Outcome("breaker_open")
	r.printf("  %s  %d slow names over %s: %s\n", at(), slowN, secs(span), slow)
	r.printf("        %d other names meanwhile: %s\n", neighbourN, neighbours)
	r.printf("        upstream_error %d, breaker_open %d; the breaker opened %d times and is %s\n",
		slowErrors, slowRefused, slowOpened, s.BreakerState())
	r.expect(slow.ServFail == slowN, "slow names: %s, want %d SERVFAIL after the timeout", slow, slowN)
	r.expect(neighbours.NoError == neighbourN, "other names: %s, want %d NOERROR", neighbours, neighbourN)
	r.expect(slowOpened == 0 && slowRefused == 0 && s.BreakerState() == "closed",
		"slow names opened the breaker (%d times, %d refused, now %s): it must see a slow name, not a dead upstream",
		slowOpened, slowRefused, s.BreakerState())

	// Half 2: the whole upstream goes dark; MIN_SAMPLES queries at once.
	r.up.SetMode(fakeupstream.Blackhole)
	dark := summarize(load(r.proxy.Addr, minSamples, minSamples, 0, 4*timeout, 1))
	s = r.scrapeCounted(slowN + neighbourN + minSamples)
	darkErrors := s.Outcome("upstream_error") - slowErrors
	r.printf("  %s  blackhole: %d queries at once → %s\n", at(), minSamples, dark)
	r.printf("        %d timed out at the upstream; the breaker opened %d times and is %s\n",
		darkErrors, s.Transitions("closed", "open"), s.BreakerState())
	r.expect(darkErrors == minSamples && s.BreakerState() == "open" && s.Transitions("closed", "open") == 1,
		"blackholed: %d timeouts, breaker %s (opened %d times); want it open after MIN_SAMPLES=%d",
		darkErrors, s.BreakerState(), s.Transitions("closed", "open"), minSamples)

	before := r.up.Total()
	open := summarize(load(r.proxy.Addr, 5, 1, 0, 4*timeout, 1))
	r.printf("  %s  open: 5 more queries → %d SERVFAIL within 10ms; the upstream received %d packets\n\n",
		at(), open.Within10ms, r.up.Total()-before)
	r.expect(open.ServFail == 5 && open.Within(timeout/2) == 5, "open breaker: %s, want 5 SERVFAILs within %s (half the timeout)", open, secs(timeout/2))
	r.expect(r.up.Total() == before, "the upstream received %d packets while open, want 0", r.up.Total()-before)

	r.outcomes(r.scrape())
	r.printf("\n  Notice: each slow name still costs its client the %s timeout and a SERVFAIL, but the\n", secs(timeout))
	r.printf("  upstream answered other names while it waited, so the timeout says \"slow name\", not\n")
	r.printf("  \"dead upstream\", and the breaker does not count it. Dark, the upstream answers nothing\n")
	r.printf("  while the queries wait: every timeout is a failure, and MIN_SAMPLES of them trip it.\n")
	r.numbers = map[string]int{"slow_servfail": slow.ServFail, "neighbours_ok": neighbours.NoError,
		"opened_slow": slowOpened, "refused_slow": slowRefused, "dark_errors": darkErrors,
		"opened": s.Transitions("closed", "open"), "open_fast": open.Within(timeout / 2)}
	return nil
}
