package main

import (
	"testing"
	"time"

	"github.com/miekg/dns"
)

// README, Flushing: POST /cache/flush "empties the cache". A refresh that
// was in flight when the cache was flushed carries the flushed entry as its
// fallback; neither its client-response timer nor its failure may serve
// that answer stale afterwards: the client gets what the refresh brings, as
// for a name not cached. (Before, the timer answered the flushed answer
// stale, EDE 3, and the operator's flush had not stopped it.)
func TestFlushedAnswerIsNotServedStaleByARefreshInFlight(t *testing.T) {
	a, up, clock := startCaching(t, func(c *Config) {
		c.CacheStale = 10 * time.Minute
		c.UpstreamTimeout = 5 * time.Second
		c.CacheStaleWait = 1800 * time.Millisecond
	})
	primeAndExpire(t, a, clock)
	gate, open := holdGate(t)
	up.SetScript(func(req *dns.Msg, _ string) [][]byte {
		<-gate
		b, _ := new(dns.Msg).SetRcode(req, dns.RcodeServerFailure).Pack()
		return [][]byte{b}
	})
	got := askWhileStaleWaits(t, a, clock)
	a.proxy.cache.store.Flush()
	clock.Advance(1800 * time.Millisecond) // the client-response timer
	open()
	r := answerWithin5s(t, "the client", got)
	wantNotStale(t, "refresh in flight at the flush", r, dns.RcodeServerFailure)
	if got := count(a, "A", "stale", 0); got != 0 {
		t.Errorf("stale %d, want 0", got)
	}
}
