package main

import (
	"net"
	"testing"
	"time"

	"dnsproxi/guard"
)

// Attack on DNS_LIMIT_ACTION=refuse as a reflector. The answers the proxy
// makes to queries no bucket bounds drop their Extended DNS Error so that
// none is larger than its query (proxy.go, TestOwnErrorAnswersDoNotAmplify:
// "with an EDE's text each would be up to 2.3 times the query that drew it,
// a reflector for a forged source"). Under refuse, the REFUSED answers to
// queries beyond either bucket are just such answers: every one is sent,
// whatever the rate, to an address nobody checked over UDP. A flood forging
// a victim's address (inside DNS_ALLOW) must then draw no byte more than it
// sends. No time passes (a manual clock): after the first query, every one
// is beyond the bucket.
func TestAttackRefuseActionAmplifiesASpoofedFlood(t *testing.T) {
	opt := []byte{0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 0}                                     // root, OPT, 1232, no options
	pkt := append([]byte{0x12, 0x34, 0x01, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0, 1}, opt...) // ". A" with EDNS: 28 bytes
	for _, gate := range []string{"DNS_CLIENT_RATE_LIMIT", "DNS_RATE_LIMIT"} {
		t.Run(gate, func(t *testing.T) {
			a, _ := startProxyEnv(t, map[string]string{gate: "1,1", "DNS_LIMIT_ACTION": "refuse"}, guard.NewManualClock(time.Now()))
			c := udpFrom(t, "127.0.0.2") // the victim's address, as the flood forges it
			to, err := net.ResolveUDPAddr("udp", a.addr())
			if err != nil {
				t.Fatal(err)
			}
			const flood = 50
			for range flood {
				if _, err := c.WriteToUDP(pkt, to); err != nil {
					t.Fatal(err)
				}
			}
			sent, got, answers := (flood-1)*len(pkt), 0, 0
			buf := make([]byte, 65535)
			for answers < flood-1 {
				c.SetReadDeadline(time.Now().Add(time.Second))
				n, _, err := c.ReadFromUDP(buf)
				if err != nil {
					break
				}
				if n >= 4 && buf[3]&0xF == 5 { // REFUSED: the first query is forwarded, the rest refused
					answers++
					got += n
				}
			}
			if got > sent {
				t.Fatalf("%d refused queries of %d bytes (%d bytes) drew %d REFUSED answers, %d bytes: %.2f× reflected, with no bucket bounding them",
					flood-1, len(pkt), sent, answers, got, float64(got)/float64(sent))
			}
		})
	}
}
