package upstream

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// timedReply is a datagram a test upstream sends, after its delay.
type timedReply struct {
	b     []byte
	after time.Duration
}

// udpReplier is an upstream on 127.0.0.1 (any port) that sends each query
// the replies reply gives, each after its own delay, in order when no delay.
func udpReplier(t *testing.T, reply func(req *dns.Msg) []timedReply) string {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 4096)
		for {
			n, from, err := conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			req := new(dns.Msg)
			if req.Unpack(buf[:n]) != nil || len(req.Question) != 1 {
				continue
			}
			for _, r := range reply(req) {
				if r.after == 0 {
					conn.WriteToUDP(r.b, from)
					continue
				}
				wg.Add(1)
				time.AfterFunc(r.after, func() { defer wg.Done(); conn.WriteToUDP(r.b, from) })
			}
		}
	})
	t.Cleanup(func() { conn.Close(); wg.Wait() })
	return conn.LocalAddr().String()
}

// caseChanged is req's answer with the question's name in another case:
// lower-cased, as some resolvers answer, or upper-cased if that changes
// nothing.
func caseChanged(req *dns.Msg) []byte {
	m := answer(req)
	m.Question[0].Name = strings.ToLower(req.Question[0].Name)
	if m.Question[0].Name == req.Question[0].Name {
		m.Question[0].Name = strings.ToUpper(req.Question[0].Name)
	}
	b, _ := m.Pack()
	return b
}

// delayedLowerCaseServer is an upstream that does not echo case and whose
// replies take rtt to come back, as from a resolver farther away.
func delayedLowerCaseServer(t *testing.T, rtt time.Duration) string {
	return udpReplier(t, func(req *dns.Msg) []timedReply { return []timedReply{{caseChanged(req), rtt}} })
}

// An upstream that does not echo case is to be found out by three probes
// and 0x20 switched off for it (README: "An upstream that does not echo the
// case is detected by three probes in a row"). A probe waits at most
// Timeout/10 for its reply (probe.go), whatever the upstream's round trip:
// an upstream whose replies take longer than that answers every probe late,
// each series ends as if the upstream were silent, 0x20 is never switched
// off, and every query with a letter in its name waits out its timeout and
// fails, for as long as the process runs. Here: a 400 ms timeout
// (DNS_UPSTREAM_TIMEOUT accepts 10ms to 30s) and an upstream 60 ms away.
func TestAttackDistantUpstreamThatDoesNotEchoCaseIsFoundOut(t *testing.T) {
	const rtt, timeout = 60 * time.Millisecond, 400 * time.Millisecond
	addr := delayedLowerCaseServer(t, rtt)
	u := newUpstream(t, Config{Addr: addr, Timeout: timeout, UDPSockets: 1})
	failed := 0
	const queries = 10
	for range queries {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := u.Exchange(ctx, q("www.example.com."), "udp")
		cancel()
		if err != nil || len(r.Answer) != 1 {
			failed++
		}
	}
	st := u.Stats()
	if !st.PlainCase || failed > 2 {
		t.Fatalf("an upstream %v away that does not echo case, timeout %v: %d of %d queries failed, 0x20 still on: %+v",
			rtt, timeout, failed, queries, st)
	}
}
