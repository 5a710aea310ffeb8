package main

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
)

// heldUpstream is a UDP upstream that counts every query the moment it
// reads it and answers only on release: what the proxy sent is counted
// while the proxy still waits.
type heldUpstream struct {
	conn     *net.UDPConn
	received atomic.Int64
	mu       sync.Mutex
	held     []heldQuery
}

type heldQuery struct {
	req  *dns.Msg
	from net.Addr
}

func startHeldUpstream(t *testing.T) *heldUpstream {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	u := &heldUpstream{conn: conn}
	done := make(chan struct{})
	t.Cleanup(func() { conn.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, from, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			req := new(dns.Msg)
			if req.Unpack(buf[:n]) != nil {
				continue
			}
			u.mu.Lock()
			u.held = append(u.held, heldQuery{req, from})
			u.mu.Unlock()
			u.received.Add(1)
		}
	}()
	return u
}

// release answers every query held.
func (u *heldUpstream) release() {
	u.mu.Lock()
	held := u.held
	u.held = nil
	u.mu.Unlock()
	for _, h := range held {
		b, _ := fakeupstream.Answer(h.req).Pack()
		u.conn.WriteTo(b, h.from)
	}
}

// Identical queries that arrive at the same instant go upstream once. A
// query that found no flight to join passes the gates before it starts its
// own; one that an identical query started meanwhile is joined then instead,
// and what the gates gave is given back. (Before, each went: bursts of 8
// identical queries at once sent 2 or 3 upstream now and then, so a burst
// could have several in flight at once.)
func TestIdenticalQueriesAtOnceGoUpstreamOnce(t *testing.T) {
	up := startHeldUpstream(t)
	cfg := testConfig(up.conn.LocalAddr().String())
	cfg.UpstreamTimeout = 10 * time.Second // held while the burst is counted; never sent again
	a := startProxy(t, cfg, guard.RealClock{})
	const rounds, burst = 40, 8
	deadline := time.Now().Add(60 * time.Second)
	for round := 0; round < rounds && time.Now().Before(deadline); round++ {
		sentBefore := up.received.Load()
		joinedBefore := testutil.ToFloat64(a.metrics.Coalesced)
		name := fmt.Sprintf("r%d.example.com", round)
		start := make(chan struct{})
		answers := make(chan *dns.Msg, burst)
		for range burst {
			go func() {
				<-start
				r, _ := tryAsk("udp", a.addr(), query(name, dns.TypeA), 10*time.Second)
				answers <- r
			}()
		}
		close(start)
		// Each query of the burst either joined a flight or was sent: once
		// they add up, no query of it is between the two.
		waitFor(t, "every query of the burst sent upstream or joined", func() bool {
			return int(up.received.Load()-sentBefore)+int(testutil.ToFloat64(a.metrics.Coalesced)-joinedBefore) == burst
		})
		sent := up.received.Load() - sentBefore
		up.release()
		for range burst {
			if r := <-answers; r == nil || r.Rcode != dns.RcodeSuccess {
				t.Fatalf("round %d: answer %v", round, r)
			}
		}
		if sent != 1 {
			t.Fatalf("round %d: %d identical queries at once went upstream %d times, want once", round, burst, sent)
		}
	}
	// What a query that joined late took of the in-flight cap it gave back.
	waitFor(t, "nothing in flight", func() bool { return testutil.ToFloat64(a.metrics.InFlight) == 0 })
	if n := a.proxy.inflight.Load(); n != 0 {
		t.Fatalf("%d queries counted in flight with every answer given", n)
	}
}
