package upstream

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// The case fallback's defence (case.go): "the spoofer must hit the one ID of
// each probe in turn, on its port, before the real upstream's exact reply
// arrives, caseProbes times in a row". A probe asks the suspect's own
// question. An attacker who is also a client picks that question: a name
// in a zone of its own whose authority never answers. Then no exact reply
// ever comes, each probe waits out the whole timeout, and a spoofer who
// knows the source port (the worst case TestPoisoningExperiment assumes)
// sweeps all 65,536 IDs within each probe's wait: 0x20 is switched off for
// the rest of the process, for every name, by an off-path sender.
func TestReviewSlowNameProbesLetASpooferSwitch0x20Off(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg {
		if strings.HasSuffix(strings.ToLower(req.Question[0].Name), ".attacker.example.") {
			return nil // the attacker's authority never answers
		}
		return []*dns.Msg{answer(req)} // echoes case, as a resolver with 0x20 support does
	})
	u := newUpstream(t, Config{Addr: srv.addr(), Timeout: 20 * time.Second, UDPSockets: 1})

	// 1. The attacker, as a client, asks a name of its own zone.
	const name = "slow.attacker.example."
	b, _ := q(name).Pack()
	u.Forward(b, "udp", func(_, _ []byte, _ error) {})

	// 2. Off-path, it sends case-changed replies to the known port, sweeping
	// the ID space until 0x20 is off (bounded: 12 sweeps).
	forged := new(dns.Msg)
	forged.SetQuestion(name, dns.TypeA) // all lower case: differs from a mixed name in some letter
	forged.Response = true
	pkt, _ := forged.Pack()
	sent := 0
	for sweep := 0; sweep < 12 && !u.Stats().PlainCase; sweep++ {
		port := portsInUse(u)[0]
		for id := range 1 << 16 {
			pkt[0], pkt[1] = byte(id>>8), byte(id)
			srv.udp.WriteToUDP(pkt, udpTo(port))
			sent++
			if id%64 == 63 {
				time.Sleep(20 * time.Microsecond) // pace the sweep so the socket's buffer holds it
			}
		}
	}
	if st := u.Stats(); st.PlainCase {
		t.Fatalf("an off-path spoofer switched 0x20 off with %d forged packets to one known port, "+
			"by making the probes ask a name that is never answered: %+v", sent, st)
	}
}

func udpTo(port int) *net.UDPAddr { return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port} }
