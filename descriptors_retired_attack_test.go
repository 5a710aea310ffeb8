package main

import (
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/upstream"
)

// openDescriptors counts the process's open file descriptors.
func openDescriptors(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count descriptors: %v", err)
	}
	return len(fds)
}

// Attack on the reserve's count of an upstream's descriptors: 8 UDP
// sockets "and as many retiring", 4 TCP, 20 in all. A UDP socket retires
// after 10,000 queries and closes only once every query it carries is
// answered or expired; against an upstream that answers late or loses a
// reply now and then (one lost reply in 10,000 keeps a socket open), a
// retired socket stays open for DNS_UPSTREAM_TIMEOUT. So a slot holds one
// retired socket per 10,000 of its queries within one timeout, not one: at
// 30 s (the largest accepted) and 24,000 queries a second to one upstream,
// 9 a slot, 80 sockets against the 20 counted, beyond the fixed 64's slack
// too. Here the upstream is silent and the queries are sent at once, the
// upstream configured as upstreams.go configures it: 240,001 queries, 3
// rotations a slot, and the upstream holds more descriptors than the
// reserve leaves it, so a DNS_TCP_MAX_CONNS the check let through meets
// EMFILE at accept.
func TestAttackRetiredSocketsPassTheUpstreamsReserve(t *testing.T) {
	silent, err := net.ListenPacket("udp", "127.0.0.1:0") // never read: every query goes unanswered
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	before := openDescriptors(t)
	u, err := upstream.New(upstream.Config{Addr: silent.LocalAddr().String(), Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	m := new(dns.Msg)
	m.SetQuestion("example.org.", dns.TypeA)
	query, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	const queries = 3*upstream.DefaultUDPSockets*upstream.DefaultSocketQueries + 1
	var ended atomic.Int64
	all := make(chan struct{})
	done := func(time.Time, []byte, []byte, error) {
		if ended.Add(1) == queries {
			close(all)
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for i := 0; i < queries && time.Now().Before(deadline); i++ {
		u.ForwardAt(time.Now(), query, "udp", time.Time{}, done)
	}
	held := openDescriptors(t) - before
	rot := u.Stats().Rotations
	u.Close()
	select {
	case <-all:
	case <-time.After(time.Until(deadline)):
		t.Fatalf("%d of %d queries ended after Close", ended.Load(), queries)
	}
	t.Logf("%d queries sent, %d rotations, %d descriptors held by the upstream", queries, rot, held)
	if held > upstreamDescriptors {
		t.Errorf("one upstream holds %d descriptors against a silent peer within one timeout, the reserve counts %d for it: the retiring sockets are not bounded by the live ones", held, upstreamDescriptors)
	}
}
