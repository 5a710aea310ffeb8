package upstream

import (
	"context"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// echoingServerWithSpoofer is an upstream that echoes case exactly, its
// replies taking rtt, and beside it a spoofer that hit each query's ID and
// port: it sends a case-changed reply at once, before the upstream's exact
// one. The test plays both from one socket; what matters is that the
// forged reply comes first and the exact one within the timeout, always.
func echoingServerWithSpoofer(t *testing.T, rtt time.Duration) string {
	return udpReplier(t, func(req *dns.Msg) []timedReply {
		exact, _ := answer(req).Pack()
		return []timedReply{{caseChanged(req), 0}, {exact, rtt}}
	})
}

// TestAttackForgedFoldedReplySetsTheProbeWindow: case.go's analysis says
// forged replies alone switch nothing off, since the upstream's exact reply
// to a probe, in time, overrules a forged one: the spoofer needs the
// upstream silent. But the probe window W now counts the quickest reply in
// another case (folded), which a spoofer who hit one ID sets: a forged
// case-changed reply a fraction of a millisecond after the query's send
// makes W its 1 ms floor, the upstream's exact reply (40 ms away, well
// inside the 1 s timeout) comes after every probe's W, and three forged
// replies switch 0x20 off for the upstream for good, though it echoes case
// and answers every probe.
func TestAttackForgedFoldedReplySetsTheProbeWindow(t *testing.T) {
	const rtt, timeout = 40 * time.Millisecond, time.Second
	addr := echoingServerWithSpoofer(t, rtt)
	u := newUpstream(t, Config{Addr: addr, Timeout: timeout, UDPSockets: 1})
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		u.Exchange(ctx, q("www.example.com."), "udp")
		cancel()
	}
	if st := u.Stats(); st.PlainCase {
		t.Fatalf("an upstream %v away that echoes case and answers every probe in time had 0x20 switched off by forged case-changed replies alone: %+v", rtt, st)
	}
}
