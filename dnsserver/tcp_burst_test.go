package dnsserver

import (
	"context"
	"encoding/binary"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// burster holds every query until n have arrived, then answers them all in
// a row from one goroutine of its own: the way an upstream's reader
// completes queries whose answers arrived in one read.
type burster struct {
	n, size int
	mu      sync.Mutex
	held    []func()
	wg      sync.WaitGroup
}

func (b *burster) ServeDNS(w ResponseWriter, q *Query) {
	reply := bigAnswer(q.Wire, q.QEnd, b.size)
	b.mu.Lock()
	b.held = append(b.held, func() { w.Write(reply) })
	var burst []func()
	if len(b.held) == b.n {
		burst, b.held = b.held, nil
	}
	b.mu.Unlock()
	if burst != nil {
		b.wg.Go(func() {
			for _, answer := range burst {
				answer()
			}
		})
	}
}

// readAnswers reads n framed answers off c and returns their IDs; it fails
// the test on the first error.
func readAnswers(t *testing.T, c io.Reader, n int) map[uint16]int {
	t.Helper()
	ids := make(map[uint16]int)
	for i := range n {
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			t.Fatalf("answer %d of %d: reading its length: %v (answers so far %v)", i+1, n, err, ids)
		}
		body := make([]byte, binary.BigEndian.Uint16(l[:]))
		if got, err := io.ReadFull(c, body); err != nil {
			t.Fatalf("answer %d of %d: got %d of its %d bytes, then %v", i+1, n, got, len(body), err)
		}
		ids[binary.BigEndian.Uint16(body)] = len(body)
	}
	return ids
}

// A client that pipelines queries whose answers are about 60 KB each (DNSSEC
// or large TXT), and reads as fast as it can, gets every answer even when
// they complete together: the bound on a connection's queue is there to
// close a client that does not read, not one whose answers came at once.
func TestPipelinedBigAnswersReachAReadingClient(t *testing.T) {
	for _, tc := range []struct {
		name    string
		queries int
		size    int
	}{
		{"three 60000-byte answers", 3, 60000},
		{"eight 60000-byte answers", 8, 60000},
		{"sixteen 60000-byte answers", 16, 60000},
		{"three 65535-byte answers", 3, dns.MaxMsgSize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dropped reasons
			h := &burster{n: tc.queries, size: tc.size}
			s := &Server{Handler: h, TCPIdleTimeout: time.Minute, OnDropped: dropped.add}
			t.Cleanup(h.wg.Wait) // after the server's Shutdown: no query reaches h any more
			addr := startServer(t, s)

			c := dialSmallReadBuffer(t, addr)
			c.SetDeadline(time.Now().Add(10 * time.Second))
			var flood []byte
			for i := range tc.queries {
				m := new(dns.Msg).SetQuestion("big.example.", dns.TypeTXT)
				m.Id = uint16(i + 1)
				flood = append(flood, frame(t, m)...)
			}
			if _, err := c.Write(flood); err != nil {
				t.Fatal(err)
			}
			ids := readAnswers(t, c, tc.queries)
			for i := range tc.queries {
				if got := ids[uint16(i+1)]; got != tc.size {
					t.Errorf("answer to ID %d: %d bytes, want %d", i+1, got, tc.size)
				}
			}
			if n := dropped.count("tcp_slow_reader"); n != 0 {
				t.Errorf("a client reading its answers was closed as a slow reader %d times", n)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.Shutdown(ctx); err != nil {
				t.Fatalf("Shutdown: %v (%d queries still pending)", err, s.Unanswered())
			}
		})
	}
}
