package main

import (
	"fmt"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
)

// A flood at a blackholed upstream: thousands of queries wait for their
// deadline at once, and not one goroutine more is spent on them.
func TestWaitingQueriesHoldNoGoroutine(t *testing.T) {
	up := startUpstream(t)
	up.SetMode(fakeupstream.Blackhole)
	cfg := testConfig(up.Addr())
	cfg.MaxInflight = 0 // no cap: every query waits
	// The flood must be at the upstream at once: a query waits there until
	// its deadline, and a loaded machine (-race, two cores) took more than
	// 1 s to send 3,000, so that at 1 s never half of them waited together.
	cfg.UpstreamTimeout = 3 * time.Second
	a := startProxy(t, cfg, guard.RealClock{})
	before := runtime.NumGoroutine()

	c, err := net.Dial("udp", a.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const flood = 3000
	for i := range flood {
		q := query(fmt.Sprintf("f%d.example.com", i), dns.TypeA)
		b, _ := q.Pack()
		c.Write(b)
		if i%100 == 99 {
			time.Sleep(time.Millisecond) // let the socket buffers drain: this is not a test of packet loss
		}
	}
	waitFor(t, "the flood to be waiting at the upstream", func() bool {
		return testutil.ToFloat64(a.metrics.InFlight) >= flood/2 // UDP may drop some; half is plenty
	})
	if during := runtime.NumGoroutine(); during > before+10 {
		t.Fatalf("%d goroutines with %v queries waiting, %d before: a waiting query must not hold one",
			during, testutil.ToFloat64(a.metrics.InFlight), before)
	}
}
