package upstream

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/batchio"
)

// An off-path spoofer who is also a client, and knows the source port (the
// worst case TestPoisoningExperiment assumes), tries to switch 0x20 off for
// good by making the probes wait on a name that is never answered: it asks
// a name of its own zone whose authority stays silent, and sweeps the whole
// ID space with case-changed replies, once per sweep for each question it
// expects a query or a probe to ask, asking afresh before every sweep (a
// fresh suspect, a fresh probe series). The probes must ask a question the
// upstream answers (case.go), and wait a few round trips, not the timeout:
//
//   - At start-up nothing was answered exactly yet: the probes ask
//     localhost, which the upstream answers at once, exactly; the spoofer
//     forges for it too.
//   - On an idle proxy the attacker made its own name the last one
//     answered exactly, then silenced it: the probes ask that name, get
//     no real reply, and the spoofer must hit each probe's ID within the
//     probe's wait (1 ms here), three probes in a row.
//
// Before the fix the probes asked the suspect's own name and waited the
// whole timeout: three sweeps, 196,608 packets, switched 0x20 off.
func TestSilentNameProbesCannotSwitch0x20Off(t *testing.T) {
	for _, tt := range []struct {
		name   string
		known  string   // answered exactly once before the attack, silent after ("": none)
		ask    string   // the attacker's query before each sweep: its authority never answers
		forge  []string // the questions the spoofer forges case-changed replies for
		sweeps int
		probed string // the question the probes ask
	}{
		{"start-up, nothing answered exactly yet", "", "slow.attacker.example.",
			[]string{"slow.attacker.example.", "localhost."}, 12, "localhost."},
		{"idle proxy, the last exact answer the attacker's silenced name", "known.attacker.example.", "known.attacker.example.",
			[]string{"known.attacker.example."}, 6, "known.attacker.example."},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			answered := map[string]bool{}
			srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg {
				name := strings.ToLower(req.Question[0].Name)
				if strings.HasSuffix(name, ".attacker.example.") {
					mu.Lock()
					defer mu.Unlock()
					if name != tt.known || answered[name] {
						return nil // the attacker's authority: silent
					}
					answered[name] = true
				}
				return []*dns.Msg{answer(req)} // echoes case, as a resolver with 0x20 support does
			})
			u := newUpstream(t, Config{Addr: srv.addr(), Timeout: 20 * time.Second, UDPSockets: 1})
			asked := 0 // the attacker's own queries for tt.probed
			if tt.known != "" {
				if _, err := u.Exchange(context.Background(), q(tt.known), "udp"); err != nil {
					t.Fatal(err)
				}
				asked++
			}
			w, err := batchio.NewWriter(srv.udp) // from the upstream's own address, as a spoofer forges it
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(w.Close)
			var pkts [][]byte
			for _, name := range tt.forge {
				forged := new(dns.Msg)
				forged.SetQuestion(name, dns.TypeA) // all lower case: the probes' names have an upper-case letter
				forged.Response = true
				pkt, _ := forged.Pack()
				pkts = append(pkts, pkt)
			}

			sent := 0
			for sweep := 0; sweep < tt.sweeps && !u.Stats().PlainCase; sweep++ {
				b, _ := q(tt.ask).Pack()
				u.Forward(b, "udp", func(_, _ []byte, _ error) {})
				if strings.EqualFold(tt.ask, tt.probed) {
					asked++
				}
				sent += sweepIDs(t, w, portsInUse(u)[0], pkts)
			}
			waitSeriesEnd(t, u)

			st := u.Stats()
			if st.PlainCase {
				t.Fatalf("an off-path spoofer switched 0x20 off with %d forged packets to one known port: %+v", sent, st)
			}
			if st.CaseMismatches == 0 || st.CaseProbes == 0 {
				t.Fatalf("the forged replies started no probe, so the test proves nothing: %+v", st)
			}
			srv.mu.Lock()
			defer srv.mu.Unlock()
			probed := -asked
			for _, name := range srv.names {
				if strings.EqualFold(name, tt.probed) {
					probed++
				}
			}
			if probed <= 0 {
				t.Fatalf("no probe asked %q, the question this case is about (%d probes): %q", tt.probed, st.CaseProbes, srv.names)
			}
			t.Logf("%d forged packets, %d sweeps: %+v", sent, tt.sweeps, st)
		})
	}
}

// The strongest off-path spoofer short of silencing the upstream: it hits
// the ID of every query and every probe, and its case-changed reply comes
// before the real one. The upstream echoes case, and its exact reply, in
// time, overrules the forged one each time: 0x20 stays on, and every query
// gets the real answer. Before the fix the first three probes counted and
// switched 0x20 off. (Once the upstream is known to echo case, a query
// whose forged reply came first is fetched over TCP, where an off-path
// spoofer cannot inject: case.go.)
func TestExactReplyOverrulesForgedCaseChange(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, tcp bool) []*dns.Msg {
		if tcp {
			return []*dns.Msg{answer(req)}
		}
		forged := answer(req)
		forged.Question[0].Name = flipCase(req.Question[0].Name)
		forged.Answer[0].(*dns.A).A = net.IPv4(203, 0, 113, 66)
		return []*dns.Msg{forged, answer(req)}
	})
	u := newUpstream(t, Config{Addr: srv.addr()})
	const queries = 10
	for i := range queries {
		r, err := u.Exchange(context.Background(), q(fmt.Sprintf("victim%d.example.", i)), "udp")
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Answer[0].(*dns.A).A; !got.Equal(net.IPv4(192, 0, 2, 1)) {
			t.Fatalf("query %d took the forged answer %v", i, got)
		}
		waitSeriesEnd(t, u) // so that the next query's forged reply starts a series of its own
	}
	if st := u.Stats(); st.PlainCase || st.CaseProbes < queries || st.CaseMismatches < 2*queries {
		t.Fatalf("%+v: want 0x20 on after %d probe series, each probe overruled by its exact reply", st, queries)
	}
}

// waitSeriesEnd waits until no probe series is under way (or 0x20 is off),
// failing the test after 5 seconds.
func waitSeriesEnd(t *testing.T, u *Upstream) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for u.cases.probing.Load() && !u.cases.plain.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("a probe series still running after 5s: %+v", u.Stats())
		}
		time.Sleep(time.Millisecond)
	}
}

// sweepIDs sends each of pkts under every one of the 65,536 IDs to port on
// 127.0.0.1 through w, in batches, paced so that the receiving socket's
// buffer holds the flood, and returns how many packets it sent.
func sweepIDs(t *testing.T, w *batchio.Writer, port int, pkts [][]byte) int {
	t.Helper()
	to := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(port))
	deadline := time.Now().Add(time.Minute)
	sent := 0
	for id := range 1 << 16 {
		for _, p := range pkts {
			p[0], p[1] = byte(id>>8), byte(id)
			for w.Send(to, p) != nil { // the writer's queue is full: let it drain
				if time.Now().After(deadline) {
					t.Fatalf("could not send one sweep within a minute")
				}
				time.Sleep(100 * time.Microsecond)
			}
			if sent++; sent%512 == 0 {
				time.Sleep(500 * time.Microsecond) // pace the flood: more forgeries read, a harder test
			}
		}
	}
	return sent
}
