package main

import (
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
)

// hostileUpstream misbehaves according to the first label of the name asked:
// "otherport" answers from another UDP port, "cut" (over TCP) closes half-way
// through the reply and answers TC over UDP; anything else is answered well.
type hostileUpstream struct {
	udp, other *net.UDPConn
	tcp        *net.TCPListener
	wg         sync.WaitGroup
}

func startHostile(t *testing.T) *hostileUpstream {
	t.Helper()
	lo := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}
	udp, tcp, err := fakeupstream.ListenPair(lo)
	if err != nil {
		t.Fatal(err)
	}
	other, err := net.ListenUDP("udp", lo)
	if err != nil {
		t.Fatal(err)
	}
	h := &hostileUpstream{udp: udp, other: other, tcp: tcp}
	h.wg.Go(h.serveUDP)
	h.wg.Go(h.serveTCP)
	t.Cleanup(func() { udp.Close(); other.Close(); tcp.Close(); h.wg.Wait() })
	return h
}

func (h *hostileUpstream) addr() string { return h.udp.LocalAddr().String() }

func label(req *dns.Msg) string {
	first, _, _ := strings.Cut(strings.ToLower(req.Question[0].Name), ".") // the name arrives in 0x20 case
	return first
}

func (h *hostileUpstream) serveUDP() {
	buf := make([]byte, 65535)
	for {
		n, from, err := h.udp.ReadFromUDP(buf)
		if err != nil {
			return
		}
		req := new(dns.Msg)
		if req.Unpack(buf[:n]) != nil {
			continue
		}
		m := fakeupstream.Answer(req)
		switch label(req) {
		case "otherport":
			b, _ := m.Pack()
			h.other.WriteToUDP(b, from)
			continue
		case "cut":
			m.Answer, m.Truncated = nil, true
		}
		b, _ := m.Pack()
		h.udp.WriteToUDP(b, from)
	}
}

func (h *hostileUpstream) serveTCP() {
	for {
		c, err := h.tcp.Accept()
		if err != nil {
			return
		}
		h.wg.Go(func() {
			defer c.Close()
			dc := &dns.Conn{Conn: c}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			for {
				req, err := dc.ReadMsg()
				if err != nil {
					return
				}
				b, _ := fakeupstream.Answer(req).Pack()
				if label(req) == "cut" {
					framed := binary.BigEndian.AppendUint16(nil, uint16(len(b)))
					c.Write(append(framed, b[:len(b)/2]...)) // half a reply, then hang up
					return
				}
				dc.WriteMsg(fakeupstream.Answer(req))
			}
		})
	}
}

// Each misbehaviour costs only the query it hit: the next one is answered.
func TestUngracefulUpstreams(t *testing.T) {
	h := startHostile(t)
	cfg := testConfig(h.addr())
	cfg.UpstreamTimeout = 200 * time.Millisecond
	a := startProxy(t, cfg, guard.RealClock{})

	for _, tt := range []struct {
		name, network string
	}{
		{"otherport.example.com", "udp"},
		{"cut.example.com", "tcp"},
	} {
		t.Run(tt.name+"/"+tt.network, func(t *testing.T) {
			r := ask(t, tt.network, a.addr(), query(tt.name, dns.TypeA))
			if r.Rcode != dns.RcodeServerFailure || len(r.Answer) != 0 {
				t.Fatalf("got %s with %q, want SERVFAIL and nothing from the bad reply", rcodeName(r), answerText(r))
			}
			r = ask(t, tt.network, a.addr(), query("fine.example.com", dns.TypeA))
			if r.Rcode != dns.RcodeSuccess || r.Question[0].Name != "fine.example.com." {
				t.Fatalf("the next query: %s for %v", rcodeName(r), r.Question)
			}
		})
	}
}

func TestUpstreamGarbageAndDuplicates(t *testing.T) {
	up := startUpstream(t)
	up.SetScript(func(req *dns.Msg, _ string) [][]byte {
		b, _ := fakeupstream.Answer(req).Pack()
		switch label(req) {
		case "garbage":
			return [][]byte{[]byte("\xff\xfe not dns at all"), b[:len(b)/2]}
		case "twice":
			return [][]byte{b, b}
		}
		return [][]byte{b}
	})
	cfg := testConfig(up.Addr())
	cfg.UpstreamTimeout = 200 * time.Millisecond
	a := startProxy(t, cfg, guard.RealClock{})
	for _, network := range []string{"udp", "tcp"} {
		if r := ask(t, network, a.addr(), query("garbage.example.com", dns.TypeA)); r.Rcode != dns.RcodeServerFailure {
			t.Errorf("%s garbage: %s, want SERVFAIL", network, rcodeName(r))
		}
		if r := ask(t, network, a.addr(), query("twice.example.com", dns.TypeA)); r.Rcode != dns.RcodeSuccess {
			t.Errorf("%s twice: %s, want the first copy", network, rcodeName(r))
		}
		r := ask(t, network, a.addr(), query("next.example.com", dns.TypeA))
		if r.Rcode != dns.RcodeSuccess || r.Question[0].Name != "next.example.com." {
			t.Errorf("%s after garbage and a duplicate: %s for %v", network, rcodeName(r), r.Question)
		}
	}
}
