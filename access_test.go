package main

import (
	"maps"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
)

// startProxyEnv runs the whole proxy configured as env says (on a free
// loopback port, metrics off, in front of a fresh fake upstream), reading
// time from clock.
func startProxyEnv(t *testing.T, env map[string]string, clock guard.Clock) (*app, *fakeupstream.Server) {
	t.Helper()
	up := startUpstream(t)
	all := map[string]string{"DNS_LISTEN": "127.0.0.1:0", "DNS_UPSTREAM": up.Addr(), "DNS_METRICS_ADDR": "off"}
	maps.Copy(all, env)
	cfg, err := readConfig(func(k string) (string, bool) { v, ok := all[k]; return v, ok }, &fakeResolver{t: t})
	if err != nil {
		t.Fatal(err)
	}
	return startProxy(t, cfg, clock), up
}

// udpFrom opens a UDP socket bound to src (an address of 127.0.0.0/8), the
// client address the proxy sees.
func udpFrom(t *testing.T, src string) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(src)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sendUDP sends m from c to addr with ID id.
func sendUDP(t *testing.T, c *net.UDPConn, addr string, m *dns.Msg, id uint16) {
	t.Helper()
	m.Id = id
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	to, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteToUDP(b, to); err != nil {
		t.Fatal(err)
	}
}

// readAll reads the answers waiting on c, until none has come for quiet
// (bounded at 5 s in all).
func readAll(t *testing.T, c *net.UDPConn, quiet time.Duration) []*dns.Msg {
	t.Helper()
	var out []*dns.Msg
	buf := make([]byte, 65535)
	end := time.Now().Add(5 * time.Second)
	for time.Now().Before(end) {
		c.SetReadDeadline(time.Now().Add(quiet))
		n, _, err := c.ReadFromUDP(buf)
		if err != nil {
			break
		}
		m := new(dns.Msg)
		if err := m.Unpack(buf[:n]); err != nil {
			t.Fatalf("an answer that does not parse: %v", err)
		}
		out = append(out, m)
	}
	return out
}

// askFrom sends m from src over network and returns the answer (nil if
// none came within timeout).
func askFrom(t *testing.T, network, src, addr string, m *dns.Msg, timeout time.Duration) *dns.Msg {
	t.Helper()
	var local net.Addr = &net.UDPAddr{IP: net.ParseIP(src)}
	if network == "tcp" {
		local = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	c := &dns.Client{Net: network, Timeout: timeout, Dialer: &net.Dialer{LocalAddr: local, Timeout: timeout}}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		return nil
	}
	return r
}

// tcpFrom dials addr over TCP from src, for queries pipelined on one connection.
func tcpFrom(t *testing.T, src, addr string) *dns.Conn {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 3 * time.Second}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	return &dns.Conn{Conn: nc}
}

// edeOf returns the Extended DNS Error of m, if it has one.
func edeOf(m *dns.Msg) (*dns.EDNS0_EDE, bool) {
	opt := m.IsEdns0()
	if opt == nil {
		return nil, false
	}
	for _, o := range opt.Option {
		if e, ok := o.(*dns.EDNS0_EDE); ok {
			return e, true
		}
	}
	return nil, false
}

// The access list at its edges: who is answered and who is REFUSED, over
// UDP and TCP, by the default list, a narrowed one and "any". 127.0.0.0/8
// is inside the default list, so denial is tested with a narrowed one.
func TestAccessList(t *testing.T) {
	tests := []struct {
		allow  string // "": unset, the default
		from   string
		denied bool
	}{
		{"", "127.0.0.1", false},
		{"", "127.255.255.254", false},
		{"127.0.0.1/32", "127.0.0.1", false},
		{"127.0.0.1/32", "127.0.0.2", true},
		{"127.0.0.2/31", "127.0.0.3", false},
		{"127.0.0.2/31", "127.0.0.4", true},
		{"127.0.0.2/31", "127.0.0.1", true},
		{"10.0.0.0/8, 127.0.1.0/24", "127.0.1.255", false},
		{"10.0.0.0/8, 127.0.1.0/24", "127.0.2.0", true},
		{"::1/128", "127.0.0.1", true}, // an IPv6 list holds no IPv4 client
		{"::ffff:127.0.0.0/104", "127.0.0.9", false},
		{"any", "127.0.0.2", false},
		{"ANY", "127.0.0.3", false},
	}
	for _, tt := range tests {
		t.Run(tt.allow+" from "+tt.from, func(t *testing.T) {
			env := map[string]string{}
			if tt.allow != "" {
				env["DNS_ALLOW"] = tt.allow
			}
			a, up := startProxyEnv(t, env, guard.RealClock{})
			for _, network := range []string{"udp", "tcp"} {
				r := askFrom(t, network, tt.from, a.addr(), ednsQuery("www.example.com", dns.TypeA, 1232, false), 3*time.Second)
				if r == nil {
					t.Fatalf("%s: no answer", network)
				}
				if !tt.denied {
					if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
						t.Fatalf("%s: %s with %d records, want the upstream's answer", network, rcodeName(r), len(r.Answer))
					}
					continue
				}
				if r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
					t.Fatalf("%s: %s with %d records, want REFUSED", network, rcodeName(r), len(r.Answer))
				}
				if e, ok := edeOf(r); !ok || e.InfoCode != dns.ExtendedErrorCodeProhibited {
					t.Fatalf("%s: EDE %v, want 18 (Prohibited)", network, e)
				}
			}
			want := 0
			if tt.denied {
				want = 2
			}
			if got := count(a, "A", "denied", want); got != want {
				t.Fatalf("denied %d, want %d", got, want)
			}
			if tt.denied && up.Total() != 0 {
				t.Fatalf("the upstream saw %d queries from a denied client", up.Total())
			}
		})
	}
}

// Over UDP a denied query's REFUSED is itself rate-limited, so a flood
// with a forged source cannot use the proxy to reflect at its victim: with
// no time passing, 200 denied queries get at most deniedBurst answers, and
// a denied client still learns it is refused. Over TCP, whose handshake
// proved the source, every one is REFUSED.
func TestDeniedAnswersAreRateLimited(t *testing.T) {
	a, up := startProxyEnv(t, map[string]string{"DNS_ALLOW": "127.0.0.1/32"}, guard.NewManualClock(time.Now()))
	const n = 200
	c := udpFrom(t, "127.0.0.2")
	for i := range n {
		sendUDP(t, c, a.addr(), query("www.example.com", dns.TypeA), uint16(i))
	}
	if got := count(a, "A", "denied", n); got != n {
		t.Fatalf("denied %d, want %d", got, n)
	}
	answers := readAll(t, c, 200*time.Millisecond)
	if len(answers) == 0 || len(answers) > deniedBurst {
		t.Fatalf("%d answers to %d denied UDP queries, want 1..%d", len(answers), n, deniedBurst)
	}
	for _, r := range answers {
		if r.Rcode != dns.RcodeRefused {
			t.Fatalf("a denied query answered %s", rcodeName(r))
		}
	}

	conn := tcpFrom(t, "127.0.0.2", a.addr())
	const overTCP = 50
	for i := range overTCP {
		q := query("www.example.com", dns.TypeA)
		q.Id = uint16(i)
		if err := conn.WriteMsg(q); err != nil {
			t.Fatal(err)
		}
	}
	for range overTCP {
		r, err := conn.ReadMsg()
		if err != nil {
			t.Fatalf("TCP: %v", err)
		}
		if r.Rcode != dns.RcodeRefused {
			t.Fatalf("TCP: a denied query answered %s", rcodeName(r))
		}
	}
	if got := count(a, "A", "denied", n+overTCP); got != n+overTCP {
		t.Fatalf("denied %d, want %d", got, n+overTCP)
	}
	if up.Total() != 0 {
		t.Fatalf("the upstream saw %d queries from a denied client", up.Total())
	}
}
