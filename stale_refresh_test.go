package main

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/exercises/fakeupstream"
)

// A refresh that fails after a later refresh of the same name succeeded
// must not put the fresh answer under the failure-recheck timer. The first
// refresh hangs, its client is answered stale by the stale-wait timer and
// it leaves the table; the next query refreshes again and stores a fresh
// answer (TTL 10); then the first comes back SERVFAIL. When the fresh
// answer expires, the healthy upstream must be asked again, not the name
// answered stale without asking until 30 s after that old failure.
func TestFailedRefreshDoesNotMarkTheFreshAnswer(t *testing.T) {
	a, up, clock := startCaching(t, func(c *Config) {
		c.UpstreamTimeout = 5 * time.Second
		c.CacheStaleWait = 1800 * time.Millisecond
	})
	primeAndExpire(t, a, clock)
	gate, open := holdGate(t)
	var calls atomic.Int64
	up.SetScript(func(req *dns.Msg, _ string) [][]byte {
		m := fakeupstream.Answer(req)
		if calls.Add(1) == 1 {
			<-gate
			m = new(dns.Msg).SetRcode(req, dns.RcodeServerFailure)
		} else {
			m.Answer[0].Header().Ttl = 10
		}
		b, _ := m.Pack()
		return [][]byte{b}
	})
	got := askWhileStaleWaits(t, a, clock)
	clock.Advance(1800 * time.Millisecond)
	staleAfterTimer(t, got)
	// The first refresh must be the one held: the stale-wait timer is armed
	// before its query reaches the upstream, and under load the query
	// below could reach the script first and be held itself (as CI saw).
	waitFor(t, "the first refresh to reach the upstream", func() bool { return calls.Load() >= 1 })
	// The next query refreshes on its own and gets the fresh answer (over
	// TCP: the fake upstream answers UDP in turn, and the first is held).
	q2 := query("www.example.com", dns.TypeA)
	q2.SetEdns0(1232, false)
	if r := ask(t, "tcp", a.addr(), q2); len(r.Answer) != 1 || r.Answer[0].Header().Ttl != 10 || len(edeCodes(r)) != 0 {
		t.Fatalf("second refresh: %s %v EDE %v, want the fresh answer, TTL 10", rcodeName(r), ttls(r), edeCodes(r))
	}
	open() // the first refresh now fails
	waitFor(t, "the first refresh to fail", func() bool {
		return metric(t, a, `dnsproxi_cache_refreshes_total{result="failed"}`) == 1
	})
	sent := up.Total()
	clock.Advance(11 * time.Second) // the fresh answer has expired; nothing has failed since it came
	r := ask(t, "tcp", a.addr(), q2)
	if up.Total() != sent+1 || len(edeCodes(r)) != 0 {
		t.Fatalf("the fresh answer expired: the upstream received %d more queries, answer TTLs %v EDE %v; want a refresh and its fresh answer (got a stale answer without asking)",
			up.Total()-sent, ttls(r), edeCodes(r))
	}
}
