package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
)

// Attack on the per-client gate's promise (README, "The per-client gate"):
// "It runs before the global bucket, so a flooder's excess never drains the
// tokens everyone shares." The gate counts UDP only, so one allowed client
// whose UDP share is spent takes the shared bucket over TCP: by itself
// (tcp), or told to by the proxy's own slip answers (slip:1, as a stub
// resolver does on TC). No time passes (a manual clock): each client's
// share is its burst of 2, the shared bucket holds 10. A polite client that
// has sent nothing yet must still be answered.
func TestAttackFlooderOverTCPDrainsTheSharedBucket(t *testing.T) {
	for _, via := range []string{"tcp", "slip"} {
		t.Run(via, func(t *testing.T) {
			env := map[string]string{"DNS_CLIENT_RATE_LIMIT": "1,2", "DNS_RATE_LIMIT": "1,10"}
			if via == "slip" {
				env["DNS_LIMIT_ACTION"] = "slip:1"
			}
			a, _ := startProxyEnv(t, env, guard.NewManualClock(time.Now()))
			const flood = 12
			retry := flood
			if via == "slip" {
				answers := floodUDP(t, a, "127.0.0.2", flood, "forwarded", "client_limited", "rate_limited")
				ok, _, tc := byRcode(answers)
				if ok != 2 || tc != flood-2 {
					t.Fatalf("UDP flood: %d answered, %d TC; want 2 and %d", ok, tc, flood-2)
				}
				retry = tc // each TC answer retried over TCP
			}
			c := tcpFrom(t, "127.0.0.2", a.addr())
			answered := 0
			for i := range retry {
				m := query(fmt.Sprintf("f%d.example.com", i), dns.TypeA)
				if err := c.WriteMsg(m); err != nil {
					t.Fatal(err)
				}
				r, err := c.ReadMsg()
				if err != nil {
					t.Fatal(err)
				}
				if r.Rcode == dns.RcodeSuccess {
					answered++
				}
			}
			r := askFrom(t, "udp", "127.0.0.3", a.addr(), query("polite.example.com", dns.TypeA), 500*time.Millisecond)
			if r == nil || r.Rcode != dns.RcodeSuccess || r.Truncated || len(r.Answer) == 0 {
				t.Fatalf("one client's TCP queries (%d answered) took the shared bucket: a polite client's first UDP query got %v (rate_limited %d), want an answer",
					answered, r, outcomeTotal(a, "rate_limited"))
			}
		})
	}
}
