package guard

import (
	"net/netip"
	"testing"
	"time"
)

// Attack on the per-client table's idea of a client: a link-local address
// names a host only together with its zone (the interface it came in on),
// and the UDP server keeps that zone (internal/batchio). fe80::1 on one
// link and fe80::1 on another are two hosts on two networks, and each has
// its own bucket. (They shared one, with the default /64 and even with
// /128: one host draining its bucket refused every link-local client of
// every other link.)
func TestAttackLinkLocalClientsOnTwoLinksHaveTheirOwnBuckets(t *testing.T) {
	for _, v6 := range []int{64, 128} {
		l := NewClientLimiter(ClientLimiterConfig{Rate: 1, Burst: 2, V6Len: v6}, NewManualClock(time.Now()))
		a := netip.MustParseAddr("fe80::1%2")
		b := netip.MustParseAddr("fe80::1%3")
		for range 2 {
			if !l.Allow(a) {
				t.Fatalf("/%d: %v refused within its burst", v6, a)
			}
		}
		if !l.Allow(b) {
			t.Fatalf("/%d: %v (another link) refused after %v spent its own bucket: the zone is dropped from the client's key", v6, b, a)
		}
	}
}
