package main

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
)

// floodUDP sends n queries from src and waits until the proxy has counted
// them all under the outcomes given, then returns the answers that came.
func floodUDP(t *testing.T, a *app, src string, n int, outcomes ...string) []*dns.Msg {
	t.Helper()
	before := 0
	for _, o := range outcomes {
		before += outcomeTotal(a, o)
	}
	c := udpFrom(t, src)
	for i := range n {
		sendUDP(t, c, a.addr(), ednsQuery(fmt.Sprintf("f%d.example.com", i), dns.TypeA, 1232, false), uint16(i))
	}
	waitFor(t, fmt.Sprintf("%d queries from %s counted", n, src), func() bool {
		got := 0
		for _, o := range outcomes {
			got += outcomeTotal(a, o)
		}
		return got-before == n
	})
	return readAll(t, c, 200*time.Millisecond)
}

// outcomeTotal sums an outcome over query types.
func outcomeTotal(a *app, outcome string) int {
	total := 0
	for _, qtype := range []string{"A", "OTHER"} {
		total += outcomes(a.proxy, qtype, outcome)
	}
	return total
}

// byRcode counts answers by RCODE and TC.
func byRcode(rs []*dns.Msg) (ok, refused, tc int) {
	for _, r := range rs {
		switch {
		case r.Truncated:
			tc++
		case r.Rcode == dns.RcodeRefused:
			refused++
		case r.Rcode == dns.RcodeSuccess:
			ok++
		}
	}
	return ok, refused, tc
}

// One client flooding over UDP spends its own bucket, not the one everyone
// shares: with a per-client burst of 3 and a global one of 5, and no time
// passing, the flooder gets 3 answers of 20 and a second client is still
// answered. Its TCP queries pay a bucket of their own, in the TCP table
// (access.go), still full; a second of refill gives it one more token.
func TestClientLimitBeforeGlobal(t *testing.T) {
	clock := guard.NewManualClock(time.Now())
	a, _ := startProxyEnv(t, map[string]string{"DNS_RATE_LIMIT": "1,5", "DNS_CLIENT_RATE_LIMIT": "1,3"}, clock)

	answers := floodUDP(t, a, "127.0.0.2", 20, "forwarded", "client_limited", "rate_limited")
	if ok, _, _ := byRcode(answers); ok != 3 || len(answers) != 3 {
		t.Fatalf("the flooder got %d answers (%d NOERROR) to 20, want its burst of 3", len(answers), ok)
	}
	if got := outcomeTotal(a, "client_limited"); got != 17 {
		t.Fatalf("client_limited %d, want 17", got)
	}
	if r := askFrom(t, "udp", "127.0.0.3", a.addr(), query("polite.example.com", dns.TypeA), 2*time.Second); r == nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("a second client got %v after the flood, want an answer: the flood drained the shared bucket", r)
	}
	if r := askFrom(t, "tcp", "127.0.0.2", a.addr(), query("tcp.example.com", dns.TypeA), 2*time.Second); r == nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("the flooder over TCP got %v, want an answer: its TCP share is its own", r)
	}
	if r := askFrom(t, "udp", "127.0.0.2", a.addr(), query("late.example.com", dns.TypeA), 300*time.Millisecond); r != nil {
		t.Fatalf("the flooder's UDP bucket is empty, yet it got %s", rcodeName(r))
	}
	clock.Advance(time.Second)
	if r := askFrom(t, "udp", "127.0.0.2", a.addr(), query("refilled.example.com", dns.TypeA), 2*time.Second); r == nil || r.Rcode != dns.RcodeSuccess {
		t.Fatalf("after a second of refill the flooder got %v, want an answer", r)
	}
}

// The prefix length makes a network one client: with 24, 127.0.5.1 and
// 127.0.5.2 share a bucket, 127.0.6.1 has its own.
func TestClientPrefixSharesABucket(t *testing.T) {
	a, _ := startProxyEnv(t, map[string]string{"DNS_CLIENT_RATE_LIMIT": "1,2", "DNS_CLIENT_PREFIX": "24,56"}, guard.NewManualClock(time.Now()))
	for i, tt := range []struct {
		from   string
		answer bool
	}{{"127.0.5.1", true}, {"127.0.5.2", true}, {"127.0.5.3", false}, {"127.0.6.1", true}} {
		r := askFrom(t, "udp", tt.from, a.addr(), query(fmt.Sprintf("p%d.example.com", i), dns.TypeA), 300*time.Millisecond)
		if (r != nil) != tt.answer {
			t.Fatalf("%s: answered %v, want %v", tt.from, r != nil, tt.answer)
		}
	}
}

// An exempt client skips the per-client bucket; the global one still applies.
func TestClientExempt(t *testing.T) {
	a, _ := startProxyEnv(t, map[string]string{"DNS_CLIENT_RATE_LIMIT": "1,1", "DNS_CLIENT_EXEMPT": "127.0.0.2/32",
		"DNS_RATE_LIMIT": "1,8"}, guard.NewManualClock(time.Now()))
	answers := floodUDP(t, a, "127.0.0.2", 10, "forwarded", "client_limited", "rate_limited")
	if len(answers) != 8 || outcomeTotal(a, "client_limited") != 0 || outcomeTotal(a, "rate_limited") != 2 {
		t.Fatalf("exempt client: %d answers of 10, client_limited %d, rate_limited %d; want 8, 0, 2",
			len(answers), outcomeTotal(a, "client_limited"), outcomeTotal(a, "rate_limited"))
	}
	answers = floodUDP(t, a, "127.0.0.3", 3, "forwarded", "client_limited", "rate_limited")
	// Each of its queries passes its own bucket and finds the shared one
	// empty, which takes nothing from its own: all three rate_limited.
	if len(answers) != 0 || outcomeTotal(a, "client_limited") != 0 || outcomeTotal(a, "rate_limited") != 5 {
		t.Fatalf("a client not exempt: %d answers, client_limited %d, rate_limited %d; want 0, 0, 5",
			len(answers), outcomeTotal(a, "client_limited"), outcomeTotal(a, "rate_limited"))
	}
}

// What a refused query gets, by DNS_LIMIT_ACTION, for the per-client and
// the global bucket: over UDP nothing (drop), REFUSED (refuse), or every
// Nth an empty TC answer (slip:N), none of them carrying an Extended DNS
// Error (no bucket bounds them: none may be larger than its query); over
// TCP always REFUSED, with EDE 0 naming the limit.
func TestLimitActions(t *testing.T) {
	const n = 12 // refused queries, after the burst of 2
	tests := []struct {
		action           string
		refused, slipped int // UDP answers to the n refused queries
	}{
		{"", 0, 0},
		{"drop", 0, 0},
		{"refuse", n, 0},
		{"REFUSE", n, 0},
		{"slip", 0, n / 2},
		{"slip:3", 0, n / 3},
		{"slip:1", 0, n},
	}
	for _, gate := range []struct{ name, env, outcome, text string }{
		{"per-client", "DNS_CLIENT_RATE_LIMIT", "client_limited", "client rate limit"},
		{"global", "DNS_RATE_LIMIT", "rate_limited", "rate limit"},
	} {
		for _, tt := range tests {
			t.Run(gate.name+" "+tt.action, func(t *testing.T) {
				env := map[string]string{gate.env: "1,2"}
				if tt.action != "" {
					env["DNS_LIMIT_ACTION"] = tt.action
				}
				a, _ := startProxyEnv(t, env, guard.NewManualClock(time.Now()))
				answers := floodUDP(t, a, "127.0.0.2", 2+n, "forwarded", gate.outcome)
				ok, refused, tc := byRcode(answers)
				if ok != 2 || refused != tt.refused || tc != tt.slipped {
					t.Fatalf("UDP: %d NOERROR, %d REFUSED, %d TC; want 2, %d, %d", ok, refused, tc, tt.refused, tt.slipped)
				}
				for _, r := range answers {
					if r.Rcode == dns.RcodeSuccess && !r.Truncated {
						continue
					}
					if len(r.Answer)+len(r.Ns) != 0 {
						t.Fatalf("a refused query got records: %v", r)
					}
					if e, has := edeOf(r); has { // no larger than the query, so no EDE (limits.go)
						t.Fatalf("a UDP answer to a refused query carries EDE %v, want none", e)
					}
				}
				// Over TCP the same client has a share of its own in the
				// per-client table (its burst of 2: access.go); the global
				// bucket is spent already.
				if gate.name == "per-client" {
					for i := range 2 {
						r := askFrom(t, "tcp", "127.0.0.2", a.addr(), ednsQuery(fmt.Sprintf("tcp%d.example.com", i), dns.TypeA, 1232, false), 2*time.Second)
						if r == nil || r.Rcode != dns.RcodeSuccess {
							t.Fatalf("TCP query %d within the client's TCP share: %v, want NOERROR", i, r)
						}
					}
				}
				r := askFrom(t, "tcp", "127.0.0.2", a.addr(), ednsQuery("tcp.example.com", dns.TypeA, 1232, false), 2*time.Second)
				if r == nil || r.Rcode != dns.RcodeRefused {
					t.Fatalf("TCP beyond the rate: %v, want REFUSED", r)
				}
				if e, has := edeOf(r); !has || e.InfoCode != dns.ExtendedErrorCodeOther || e.ExtraText != gate.text {
					t.Fatalf("TCP: EDE %v, want 0 (Other) %q", e, gate.text)
				}
			})
		}
	}
}

// The table's series follow the table, and no label of any series holds an
// address or a prefix: clients are a decision dimension, never a metric one.
func TestClientTableMetrics(t *testing.T) {
	a, _ := startProxyEnv(t, map[string]string{"DNS_CLIENT_RATE_LIMIT": "1,1", "DNS_CLIENT_TABLE_SIZE": "8",
		"DNS_CLIENT_EXEMPT": "127.0.0.9"}, guard.NewManualClock(time.Now()))
	for i := 1; i <= 12; i++ { // 12 busy prefixes for 8 slots
		floodUDP(t, a, fmt.Sprintf("127.0.0.%d", 10+i), 1, "forwarded", "client_limited")
	}
	floodUDP(t, a, "127.0.0.9", 1, "forwarded")
	families, err := a.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if _, err := netip.ParseAddr(l.GetValue()); err == nil {
					t.Errorf("%s{%s=%q}: a label holds an address", f.GetName(), l.GetName(), l.GetValue())
				}
				if _, err := netip.ParsePrefix(l.GetValue()); err == nil {
					t.Errorf("%s{%s=%q}: a label holds a prefix", f.GetName(), l.GetName(), l.GetValue())
				}
			}
			if m.GetGauge() != nil {
				values[f.GetName()] = m.GetGauge().GetValue()
			} else if m.GetCounter() != nil && len(m.GetLabel()) == 0 {
				values[f.GetName()] = m.GetCounter().GetValue()
			}
		}
	}
	if got := values["dnsproxi_client_table_entries"]; got != 8 {
		t.Errorf("client_table_entries %v, want 8 (the table's size; the exempt client takes no slot)", got)
	}
	if got := values["dnsproxi_client_overflow_total"]; got != 4 {
		t.Errorf("client_overflow_total %v, want 4 (12 busy prefixes, 8 slots)", got)
	}
	if got := values["dnsproxi_client_table_evictions_total"]; got != 0 {
		t.Errorf("client_table_evictions_total %v, want 0: no bucket was full again", got)
	}
}

// A client refused by the shared bucket keeps its own token: under an
// overload others caused (the shared bucket empty), a polite client's
// refused queries are rate_limited and cost its share nothing, so when the
// shared bucket has refilled it is answered, not counted client_limited
// for tokens it never used. Per-client rate 1, burst 3; shared rate 10,
// burst 5; 300ms later the shared bucket holds 3 tokens again, the
// client's own would hold 0.3 had its refused queries spent it.
func TestClientKeepsItsTokenWhenTheSharedBucketRefuses(t *testing.T) {
	clock := guard.NewManualClock(time.Now())
	a, _ := startProxyEnv(t, map[string]string{"DNS_RATE_LIMIT": "10,5", "DNS_CLIENT_RATE_LIMIT": "1,3"}, clock)
	for i := range 5 { // five other clients take the shared burst
		floodUDP(t, a, fmt.Sprintf("127.0.0.%d", 10+i), 1, "forwarded")
	}
	if answers := floodUDP(t, a, "127.0.0.2", 3, "rate_limited", "client_limited"); len(answers) != 0 {
		t.Fatalf("the shared bucket is empty, yet the polite client got %d answers", len(answers))
	}
	if got := outcomeTotal(a, "client_limited"); got != 0 {
		t.Fatalf("client_limited %d during the overload, want 0: the client stayed within its share", got)
	}
	clock.Advance(300 * time.Millisecond)
	answers := floodUDP(t, a, "127.0.0.2", 3, "forwarded", "client_limited", "rate_limited")
	if ok, _, _ := byRcode(answers); ok != 3 {
		t.Fatalf("after the overload the polite client got %d answers of 3 (client_limited %d, rate_limited %d); want 3: its refused queries spent its share",
			ok, outcomeTotal(a, "client_limited"), outcomeTotal(a, "rate_limited"))
	}
	if got := outcomeTotal(a, "client_limited"); got != 0 {
		t.Fatalf("client_limited %d, want 0", got)
	}
}
