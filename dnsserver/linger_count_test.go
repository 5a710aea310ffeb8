package dnsserver

import (
	"fmt"
	"net"
	"testing"
	"time"
)

// A connection closed for a newcomer while maxLingering closes are under
// way is closed at once, and counted: of maxLingering+30 evicted by
// clients that never close their side, the first maxLingering linger and
// 30 are forced. A connection closed while Shutdown lets every one linger
// is not counted.
func TestForcedClosesAreCounted(t *testing.T) {
	const slots = 2
	const forced = 30
	const flood = maxLingering + forced
	var dropped reasons
	s := &Server{MaxTCPConns: slots, TCPIdleTimeout: time.Minute, OnDropped: dropped.add, lingerTime: time.Minute}
	addr := startServer(t, s)
	for i := range slots + flood {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		waitFor(t, "the newcomer taking its slot", func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return len(s.conns) == min(i+1, slots) && dropped.count("tcp_idle_evicted") == max(0, i+1-slots)
		})
	}
	// Each evicted connection ends on its own goroutine: wait for the last.
	// Neither count can go past what is awaited, each lingers a minute.
	waitFor(t, fmt.Sprintf("%d lingering and %d forced closes", maxLingering, forced), func() bool {
		return s.lingeringConns() == maxLingering && s.ForcedCloses() == forced
	})
}
