package upstream

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// A slot holds one retired socket at most, so an upstream holds two sockets
// a slot, what the descriptor reserve counts. A retired socket whose
// queries were all answered stays in the slot until the sweeper's next tick
// (up to 100 ms) closes it; a socket that reached its bound in that time
// found no retired socket carrying a query, retired too, and the slot held
// three. It takes a burst that reaches SocketQueries twice within a tick,
// or a current socket kept while a slow upstream's replies drain (rotate)
// reaching its bound again just after the last of them came.
func TestSlotHoldsOneRetiredSocketAtMost(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg { return []*dns.Msg{answer(req)} })
	// A long timeout: the sweeper ticks every 100 ms, far slower than the burst.
	u := newUpstream(t, Config{Addr: srv.addr(), UDPSockets: 1, SocketQueries: 3, Timeout: 10 * time.Second, Disable0x20: true})
	for i := range 9 {
		if _, err := u.Exchange(context.Background(), q(fmt.Sprintf("n%d.example.", i)), "udp"); err != nil {
			t.Fatal(err)
		}
		if n := len(u.socks[0].sockets()); n > 2 {
			t.Fatalf("after query %d (bound 3 a socket): the slot holds %d sockets, want 2 at most", i+1, n)
		}
	}
	if st := u.Stats(); st.Rotations == 0 {
		t.Fatalf("%+v: no rotation; the test expects the sockets to reach their bound", st)
	}
}
