package main

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
)

// The README: "a slow name times out while its neighbours are answered,
// so it costs its own client a SERVFAIL and never opens the breaker for
// everyone". Under sequential, the backup sees nothing but hedges, and a
// hedge is by construction a query the primary was slow on: a handful of
// slow names, within the retry budget, are all the backup is asked, so
// each of its timeouts has no neighbour to vouch for it and counts as a
// failure. The backup's breaker opens while both upstreams are healthy,
// and stays open while the slow names go on (each half-open probe is
// another slow hedge). When the primary then goes silent, nothing is
// hedged to the backup: the client that the README's failover drill
// answers in a quarter of the timeout waits out the whole of it for a
// SERVFAIL.
func TestAttackSlowNamesHedgedToTheBackupDoNotOpenItsBreaker(t *testing.T) {
	primary, backup := startUpstream(t), startUpstream(t)
	for _, up := range []*fakeupstream.Server{primary, backup} {
		up.SetDelay(5 * time.Second) // "slow.*" names: longer than the timeout, at both
	}
	cfg := failoverConfig(primary.Addr(), backup.Addr())
	cfg.UpstreamTimeout, cfg.UpstreamHedge = 500*time.Millisecond, Hedge{After: 100 * time.Millisecond, Given: true}
	cfg.BreakerThreshold, cfg.BreakerMinSamples, cfg.BreakerWindow = 50, 10, 100
	a := startProxy(t, cfg, guard.RealClock{})

	// The primary answers a steady load; 10 slow names come among it (the
	// budget: 10% of the first attempts, and 3 a second in any case).
	for i := range 150 {
		if r := ask(t, "udp", a.addr(), query(fmt.Sprintf("n%d.example.com", i), dns.TypeA)); r.Rcode != dns.RcodeSuccess {
			t.Fatalf("normal query %d: %s", i, rcodeName(r))
		}
	}
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tryAsk("udp", a.addr(), query(fmt.Sprintf("slow.s%d.example.com", i), dns.TypeA), 2*time.Second)
		}()
	}
	for i := range 40 { // the primary goes on answering its neighbours meanwhile
		ask(t, "udp", a.addr(), query(fmt.Sprintf("m%d.example.com", i), dns.TypeA))
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	hedges := int(testutil.ToFloat64(a.metrics.Retries.WithLabelValues("hedge")))
	backupUDP, _ := backup.Received()
	if s := a.breaker(0).State(); s != guard.Closed {
		t.Fatalf("the primary's breaker %v: its slow names had neighbours", s)
	}
	if s := a.breaker(1).State(); s != guard.Closed {
		// What this costs: the primary goes silent, and a client is not
		// hedged to the healthy backup.
		primary.SetMode(fakeupstream.Blackhole)
		start := time.Now()
		r, err := tryAsk("udp", a.addr(), query("after.example.com", dns.TypeA), 3*time.Second)
		rc := "no reply"
		if err == nil {
			rc = rcodeName(r)
		}
		t.Fatalf("the healthy backup's breaker is %v after %d hedges of slow names (it was sent %d packets, all of them slow names); "+
			"then with the primary silent a client got %s after %v instead of the backup's answer after the 100ms hedge",
			s, hedges, backupUDP, rc, time.Since(start).Round(10*time.Millisecond))
	}
}
