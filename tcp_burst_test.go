package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
)

// burstUpstream is an upstream on loopback that holds the TCP queries it
// gets until n have arrived, then answers them all at once with TXT answers
// of about size bytes: what a resolver does when n DNSSEC-heavy answers
// complete together.
type burstUpstream struct {
	n, size int
	tcp     *net.TCPListener
	mu      sync.Mutex
	held    []burstQuery
	wg      sync.WaitGroup
}

type burstQuery struct {
	conn  net.Conn
	query *dns.Msg
}

// startBurstUpstream listens on a free loopback port (UDP bound too, so the
// port is the same for both, and left unread) until the test ends.
func startBurstUpstream(t *testing.T, n, size int) *burstUpstream {
	t.Helper()
	udp, tcp, err := fakeupstream.ListenPair(&net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	u := &burstUpstream{n: n, size: size, tcp: tcp}
	var conns []net.Conn
	var connsMu sync.Mutex
	u.wg.Go(func() {
		for {
			c, err := tcp.Accept()
			if err != nil {
				return
			}
			connsMu.Lock()
			conns = append(conns, c)
			connsMu.Unlock()
			u.wg.Go(func() { u.serve(c) })
		}
	})
	t.Cleanup(func() {
		udp.Close()
		tcp.Close()
		connsMu.Lock()
		for _, c := range conns {
			c.Close()
		}
		connsMu.Unlock()
		u.wg.Wait()
	})
	return u
}

func (u *burstUpstream) addr() string { return u.tcp.Addr().String() }

// serve reads queries off c, bounded by a deadline, and answers every n-th
// arrival, across connections, together with the ones held before it.
func (u *burstUpstream) serve(c net.Conn) {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	for {
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return
		}
		pkt := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, pkt); err != nil {
			return
		}
		req := new(dns.Msg)
		if err := req.Unpack(pkt); err != nil || len(req.Question) != 1 {
			return
		}
		u.mu.Lock()
		u.held = append(u.held, burstQuery{c, req})
		var burst []burstQuery
		if len(u.held) == u.n {
			burst, u.held = u.held, nil
		}
		u.mu.Unlock()
		// One write a connection: its answers arrive in one piece and the
		// proxy's reader completes them one after another.
		out := make(map[net.Conn][]byte)
		for _, h := range burst {
			b, err := burstTXT(h.query, u.size).Pack()
			if err != nil {
				return
			}
			out[h.conn] = append(binary.BigEndian.AppendUint16(out[h.conn], uint16(len(b))), b...)
		}
		for conn, b := range out {
			conn.Write(b)
		}
	}
}

// burstTXT answers req with TXT records up to about size bytes.
func burstTXT(req *dns.Msg, size int) *dns.Msg {
	m := new(dns.Msg).SetReply(req)
	if opt := req.IsEdns0(); opt != nil {
		m.SetEdns0(opt.UDPSize(), opt.Do())
	}
	txt := string(make([]byte, 250))
	for m.Len() < size-300 {
		m.Answer = append(m.Answer, &dns.TXT{Hdr: dns.RR_Header{Name: req.Question[0].Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 60}, Txt: []string{txt}})
	}
	return m
}

// A client pipelines queries whose answers are about 60 KB each and reads
// them as fast as it can; the upstream answers them all at once. The proxy
// must deliver every answer, not close the connection as a slow reader
// because the answers landed together.
func TestTCPPipelinedBigAnswersLandingTogether(t *testing.T) {
	for _, n := range []int{3, 8} {
		t.Run(fmt.Sprintf("%d answers", n), func(t *testing.T) {
			up := startBurstUpstream(t, n, 60000)
			a := startProxy(t, testConfig(up.addr()), guard.RealClock{})
			c, err := dns.Dial("tcp", a.addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			for i := range n {
				m := query(fmt.Sprintf("q%d.big.example", i), dns.TypeTXT)
				m.Id = uint16(i + 1)
				if err := c.WriteMsg(m); err != nil {
					t.Fatal(err)
				}
			}
			seen := make(map[uint16]bool)
			for i := range n {
				r, err := c.ReadMsg()
				if err != nil {
					if errors.Is(err, io.EOF) {
						err = fmt.Errorf("the proxy closed the connection: %w", err)
					}
					t.Fatalf("answer %d of %d: %v (IDs so far %v)", i+1, n, err, seen)
				}
				if r.Len() < 59000 || r.Rcode != dns.RcodeSuccess {
					t.Fatalf("answer to ID %d: %s, %d bytes; want the upstream's 60 KB", r.Id, rcodeName(r), r.Len())
				}
				seen[r.Id] = true
			}
			if len(seen) != n {
				t.Fatalf("answers to IDs %v, want %d distinct", seen, n)
			}
		})
	}
}
