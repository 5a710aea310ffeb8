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

// echoingServerWithSpoofer is an upstream on 127.0.0.1 that echoes case
// exactly, its replies taking rtt, and beside it a spoofer that hit each
// query's ID and port: it sends a case-changed reply (the name lower-cased)
// at once, before the upstream's exact one. The test plays both from one
// socket; what matters is that the forged reply comes first and the exact
// one within the timeout, always.
func echoingServerWithSpoofer(t *testing.T, port int, rtt time.Duration) string {
	t.Helper()
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
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
			exact, _ := answer(req).Pack()
			forged := answer(req)
			forged.Question[0].Name = strings.ToLower(req.Question[0].Name)
			if forged.Question[0].Name == req.Question[0].Name {
				forged.Question[0].Name = strings.ToUpper(req.Question[0].Name)
			}
			fb, _ := forged.Pack()
			conn.WriteToUDP(fb, from) // the spoofer, first
			wg.Add(1)
			time.AfterFunc(rtt, func() { defer wg.Done(); conn.WriteToUDP(exact, from) })
		}
	})
	t.Cleanup(func() { conn.Close(); wg.Wait() })
	return conn.LocalAddr().String()
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
	addr := echoingServerWithSpoofer(t, 27901, rtt)
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
