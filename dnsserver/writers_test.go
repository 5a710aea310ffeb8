package dnsserver

import (
	"context"
	"testing"
	"time"

	"dnsproxi/internal/batchio"
)

// A server given a writers group puts each UDP socket's writer in it while
// it serves, and takes them out when it shuts down.
func TestServerJoinsItsWritersGroup(t *testing.T) {
	var g batchio.Group
	s := &Server{UDPSockets: 2, Writers: &g}
	startServer(t, s)
	held := g.Hold()
	batchio.Release(held)
	if want := len(s.udp); len(held) != want {
		t.Fatalf("the group holds %d writers while serving, want %d (one a socket)", len(held), want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if held := g.Hold(); len(held) != 0 {
		t.Fatalf("the group still holds %d writers after Shutdown", len(held))
	}
}
