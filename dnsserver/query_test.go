package dnsserver

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// seen is a handler that answers at once and passes on what it was given.
type seen chan Query

func (s seen) ServeDNS(w ResponseWriter, q *Query) {
	w.Write(wire.AppendReply(nil, q.Wire, q.QEnd, dns.RcodeSuccess))
	c := *q
	c.Wire = nil // not ours to keep
	s <- c
}

// The handler learns each client's address, over UDP and TCP, from many
// source addresses of 127.0.0.0/8.
func TestQueryClient(t *testing.T) {
	h := make(seen, 10)
	addr := startServer(t, &Server{Handler: h})
	for _, tt := range []struct {
		network string
		from    string
	}{{"udp", "127.0.0.2"}, {"tcp", "127.0.0.3"}, {"udp", "127.0.0.4"}} {
		t.Run(tt.network+" from "+tt.from, func(t *testing.T) {
			var local net.Addr = &net.UDPAddr{IP: net.ParseIP(tt.from)}
			if tt.network == "tcp" {
				local = &net.TCPAddr{IP: net.ParseIP(tt.from)}
			}
			c := &dns.Client{Net: tt.network, Timeout: 3 * time.Second, Dialer: &net.Dialer{LocalAddr: local}}
			conn, err := c.Dial(addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, _, err := c.ExchangeWithConn(new(dns.Msg).SetQuestion("a.example.", dns.TypeA), conn); err != nil {
				t.Fatal(err)
			}
			want, _ := netip.ParseAddrPort(conn.LocalAddr().String())
			select {
			case q := <-h:
				if q.Client != want {
					t.Fatalf("Query.Client %v, want %v", q.Client, want)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("the handler was not called")
			}
		})
	}
}

// A query whose header reads but whose rest does not goes to the handler,
// marked Malformed, so the handler's gates decide whether it is answered;
// packets too short for a header, and responses, are dropped by the server.
func TestServeHandsMalformedQueriesToTheHandler(t *testing.T) {
	pack := func(m *dns.Msg) []byte { b, _ := m.Pack(); return b }
	q := new(dns.Msg).SetQuestion("a.example.", dns.TypeA)
	plain := pack(q)
	q.SetEdns0(1232, true)
	edns := pack(q)
	twoOPT := append(append([]byte(nil), edns...), edns[len(edns)-11:]...)
	twoOPT[11] = 2
	tests := []struct {
		name      string
		pkt       []byte
		handled   bool
		malformed bool
	}{
		{"well-formed", plain, true, false},
		{"EDNS", edns, true, false},
		{"cut question", plain[:len(plain)-1], true, true},
		{"trailing bytes", append(append([]byte(nil), plain...), 0), true, true},
		{"two OPT records", twoOPT, true, true},
		{"header only, qdcount 1", plain[:12], true, true},
		{"short", plain[:11], false, false},
		{"response", pack(new(dns.Msg).SetReply(q)), false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := make(seen, 1)
			s := &Server{Handler: h}
			s.setDefaults()
			r := &recorder{}
			r.start(s)
			s.ServePacket(r, tt.pkt)
			select {
			case q := <-h:
				if !tt.handled || q.Malformed != tt.malformed {
					t.Fatalf("handled with Malformed %v; want handled %v, Malformed %v", q.Malformed, tt.handled, tt.malformed)
				}
			default:
				if tt.handled {
					t.Fatal("not handed to the handler")
				}
				if !r.dropped {
					t.Fatal("neither handled nor dropped")
				}
			}
		})
	}
}
