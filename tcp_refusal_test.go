package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
)

// Over TCP a refusal is always an answer: one connection pipelining 100
// queries past the entry gate (DNS_LIMIT_ACTION=drop, which drops only over
// UDP) and past DNS_MAX_INFLIGHT, with a slow upstream, gets exactly one
// answer per query, each on its ID, every one beyond the gates REFUSED.
func TestTCPRefusalsAreAnswersUnderPipelining(t *testing.T) {
	up := startUpstream(t)
	held, release := holdGate(t) // the queries let through wait until every other is answered
	up.SetScript(func(req *dns.Msg, _ string) [][]byte {
		<-held
		b, _ := fakeupstream.Answer(req).Pack()
		return [][]byte{b}
	})
	cfg := testConfig(up.Addr())
	cfg.UpstreamTimeout = 10 * time.Second
	cfg.RateLimit = RateLimit{Rate: 0.001, Burst: 50}
	cfg.LimitAction = LimitAction{Kind: ActionDrop}
	cfg.MaxInflight = 4
	a := startProxy(t, cfg, guard.RealClock{})

	const queries = 100
	c, err := net.DialTimeout("tcp", a.addr(), 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var burst []byte
	for i := range queries {
		m := query(fmt.Sprintf("q%d.example.com", i), dns.TypeA)
		m.Id = uint16(i)
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		burst = binary.BigEndian.AppendUint16(burst, uint16(len(b)))
		burst = append(burst, b...)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(burst); err != nil {
		t.Fatal(err)
	}
	seen := make(map[uint16]bool)
	refused := 0
	for len(seen) < queries {
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			t.Fatalf("%d of %d answered (%d REFUSED), then %v", len(seen), queries, refused, err)
		}
		b := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatal(err)
		}
		m := new(dns.Msg)
		if err := m.Unpack(b); err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("q%d.example.com.", m.Id); seen[m.Id] || len(m.Question) != 1 || m.Question[0].Name != want {
			t.Fatalf("answer %d for %v: twice, or not its question", m.Id, m.Question)
		}
		seen[m.Id] = true
		if m.Rcode == dns.RcodeRefused {
			refused++
		}
		if len(seen) == queries-cfg.MaxInflight {
			release() // the rest are the ones at the upstream
		}
	}
	if refused < queries-cfg.MaxInflight {
		t.Fatalf("%d of %d REFUSED, want at least %d", refused, queries, queries-cfg.MaxInflight)
	}
}
