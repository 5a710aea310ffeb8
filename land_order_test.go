package main

import (
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A query that comes while a flight lands finds its answer one way or the
// other: in the table (it joins, and the landing answers it) or in the
// cache. The flight leaves the table only once its answer is in the
// cache. (Before, it left the table first: a query that came between the
// two found neither and asked the upstream again.)
func TestQueryWhileAFlightLandsIsNotSentAgain(t *testing.T) {
	a, up, _ := startCaching(t, nil)
	name := "landing.example.com"
	var once sync.Once
	second := make(chan *dns.Msg, 1)
	hook := func() {
		once.Do(func() {
			// The identical query comes now, between the two hand-overs.
			go func() {
				r, _ := tryAsk("udp", a.addr(), query(name, dns.TypeA), 5*time.Second)
				second <- r
			}()
			// It is settled once it was answered from the cache, or sent
			// upstream, or joined this flight (then the landing answers it).
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				udp, _ := up.Received()
				if udp > 1 || testutil.ToFloat64(a.metrics.Queries.WithLabelValues("A", "cached")) == 1 || testutil.ToFloat64(a.metrics.Coalesced) == 1 {
					return
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	a.proxy.landing.Store(&hook)
	first, err := tryAsk("udp", a.addr(), query(name, dns.TypeA), 5*time.Second)
	if err != nil || first.Rcode != dns.RcodeSuccess {
		t.Fatalf("first: %v %v", first, err)
	}
	select {
	case r := <-second:
		if r == nil || r.Rcode != dns.RcodeSuccess {
			t.Fatalf("second: %v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the second query unanswered within 5 s")
	}
	if udp, _ := up.Received(); udp != 1 {
		t.Fatalf("the upstream got %d queries for one name asked twice while its answer landed, want 1", udp)
	}
}
