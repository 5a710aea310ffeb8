package guard

import (
	"net/netip"
	"testing"
	"time"
)

// Attack on the link-local key from the other side: the zone's hash takes
// the place of bits 16–47, but a host chooses every other bit of its own
// link-local address too. fe80::/10 is link-local, so bits 10–15 are free,
// and bits 48–63 lie inside the default /64 as well. A host on one link
// that binds fe80:0:0:N::1 (or fe81::1, febf::1...) has, at /64, a new
// bucket, full, for each N: 2^22 buckets to spend from one interface, and
// over TCP, where the handshake proves the source and the README says no
// forged flood reaches the table, each of those addresses is its own. At
// /64 every other client is its network's one bucket (fe80::1 and fe80::2
// on a link share one here, as two hosts of one global /64 do); a
// link-local host is its link's network, and should not mint more.
func TestAttackLinkLocalHostSpreadsOverBitsItChooses(t *testing.T) {
	l := NewClientLimiter(ClientLimiterConfig{Rate: 1, Burst: 1}, NewManualClock(time.Now())) // /64, the default
	same := []string{"fe80::1%2", "fe80::2%2"}                                                // one link, two hosts: one /64
	if !l.Allow(netip.MustParseAddr(same[0])) || l.Allow(netip.MustParseAddr(same[1])) {
		t.Fatalf("%v and %v on one link do not share their /64's bucket of 1: the premise fails", same[0], same[1])
	}
	admitted := 0
	for _, a := range []string{"fe80:0:0:1::1%2", "fe80:0:0:2::1%2", "fe80:0:0:ffff::1%2", "fe81::1%2", "febf::1%2"} {
		addr := netip.MustParseAddr(a)
		if !addr.IsLinkLocalUnicast() {
			t.Fatalf("%v is not link-local", addr)
		}
		if l.Allow(addr) {
			admitted++
			t.Logf("%v: a fresh bucket on link 2", addr)
		}
	}
	if admitted > 0 {
		t.Errorf("link 2's /64 spent its burst of 1, yet %d more queries from link 2 were admitted at a stopped clock: a link-local host mints buckets from bits 10–15 and 48–63 of its own address", admitted)
	}
}
