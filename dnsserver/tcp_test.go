package dnsserver

import (
	"encoding/binary"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// frame returns m packed with its TCP length prefix.
func frame(t *testing.T, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...)
}

// reasons counts OnDropped's calls by reason.
type reasons struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *reasons) add(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = make(map[string]int)
	}
	r.n[reason]++
}

func (r *reasons) count(reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[reason]
}

// paddedQuery returns a query of exactly size bytes, padded with EDNS
// padding (RFC 7830).
func paddedQuery(t *testing.T, size int) *dns.Msg {
	t.Helper()
	m := new(dns.Msg).SetQuestion("www.example.com.", dns.TypeA)
	m.SetEdns0(1232, false)
	pad := &dns.EDNS0_PADDING{}
	m.IsEdns0().Option = append(m.IsEdns0().Option, pad)
	pad.Padding = make([]byte, size-m.Len())
	if m.Len() != size {
		t.Fatalf("padded query of %d bytes, want %d", m.Len(), size)
	}
	return m
}

// A query over TCP is as small as one over UDP: a length beyond the cap
// closes the connection before its body is read, and is counted.
func TestTCPQueryTooLarge(t *testing.T) {
	tests := []struct {
		name     string
		length   int
		answered bool
	}{
		{"at the cap", udpBufSize, true},
		{"one byte beyond", udpBufSize + 1, false},
		{"the largest a length can say", 65535, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var dropped reasons
			addr := startServer(t, &Server{TCPIdleTimeout: time.Minute, OnDropped: dropped.add})
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if tt.answered {
				conn := &dns.Conn{Conn: c}
				conn.SetDeadline(time.Now().Add(5 * time.Second))
				if err := conn.WriteMsg(paddedQuery(t, tt.length)); err != nil {
					t.Fatal(err)
				}
				if r, err := conn.ReadMsg(); err != nil || r.Rcode != dns.RcodeSuccess {
					t.Fatalf("a %d-byte query: %v %v", tt.length, r, err)
				}
				if n := dropped.count("malformed"); n != 0 {
					t.Errorf("OnDropped(malformed) called %d times for a query within the cap", n)
				}
				return
			}
			// Only the length: a server that waits for the body keeps the
			// connection for the whole idle timeout.
			c.Write(binary.BigEndian.AppendUint16(nil, uint16(tt.length)))
			if !closedByServer(c, 5*time.Second) {
				t.Fatalf("a length of %d kept the connection open", tt.length)
			}
			if n := dropped.count("malformed"); n != 1 {
				t.Errorf("OnDropped(malformed) called %d times, want 1", n)
			}
		})
	}
}
