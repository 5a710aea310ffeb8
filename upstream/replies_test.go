//go:build unix

package upstream

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/batchio"
	"dnsproxi/internal/udptest"
)

// While a UDP socket's reader hands replies to their queries, it holds
// Config.Replies: an answer a completion sends through a writer of that
// group leaves when the batch is done, not from inside the completion.
func TestReaderHoldsRepliesWhileCompleting(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg { return []*dns.Msg{answer(req)} })
	sink := udptest.Listen(t)
	w, err := batchio.NewWriter(udptest.Listen(t))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var replies batchio.Group
	replies.Add(w)
	u := newUpstream(t, Config{Addr: srv.addr(), Replies: &replies, Disable0x20: true})

	b, _ := q("held.example.").Pack()
	type seen struct {
		err       error
		leftEarly bool // the answer reached the client before the completion returned
	}
	done := make(chan seen, 1)
	u.Forward(b, "udp", func(_, reply []byte, err error) {
		if err != nil {
			done <- seen{err: err}
			return
		}
		w.Send(sink.LocalAddr().(*net.UDPAddr).AddrPort(), reply)
		done <- seen{leftEarly: udptest.Waiting(t, sink)} // loopback delivers within the send: anything sent is there now
	})
	var s seen
	select {
	case s = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("no completion within 5s")
	}
	if s.err != nil {
		t.Fatal(s.err)
	}
	if s.leftEarly {
		t.Fatal("the answer left from inside the completion: the reader did not hold Config.Replies")
	}
	sink.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := sink.Read(make([]byte, 512)); err != nil {
		t.Fatalf("the answer never left once the batch was done: %v", err)
	}
}

// Each open UDP socket's writer is in Config.Queries, and leaves it when
// the socket closes: a rotated socket's successor takes its place.
func TestSocketsJoinQueries(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg { return []*dns.Msg{answer(req)} })
	var queries batchio.Group
	u, err := New(Config{Addr: srv.addr(), Queries: &queries, UDPSockets: 3, SocketQueries: 2, Disable0x20: true})
	if err != nil {
		t.Fatal(err)
	}
	count := func() int { h := queries.Hold(); batchio.Release(h); return len(h) }
	if n := count(); n != 3 {
		t.Fatalf("%d writers in Queries with 3 sockets open, want 3", n)
	}
	done := make(chan error, 12)
	for i := range 12 { // every socket reaches its bound and rotates
		b, _ := q(fmt.Sprintf("r%d.example.", i)).Pack()
		u.Forward(b, "udp", func(_, _ []byte, err error) { done <- err })
	}
	for range 12 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no answer within 5s")
		}
	}
	if st := u.Stats(); st.Rotations == 0 {
		t.Fatalf("no socket rotated: %+v", st)
	}
	u.Close()
	if n := count(); n != 0 {
		t.Fatalf("%d writers left in Queries after Close, want 0", n)
	}
}
