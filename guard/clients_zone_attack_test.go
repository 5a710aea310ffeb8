package guard

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"time"
)

// Attack on the zone fold of link-local clients: the zone's hash is XORed
// into bits 16–47 of the address, bits a host on a link chooses itself
// (fe80::/10 is link-local, not only fe80::/64), and the hash is FNV-1a of
// the interface index, unseeded. So a host on link 2 that takes the address
// fe80:0:h(2)^h(3)::1 lands on the very key of fe80::1 on link 3, and drains
// the bucket of a client on another network, whose address it cannot send
// from: what the head comments promise cannot happen without the seed.
func TestAttackLinkLocalHostAimsAtAnotherLinksBucket(t *testing.T) {
	for _, v6 := range []int{48, 64, 128} {
		l := NewClientLimiter(ClientLimiterConfig{Rate: 1, Burst: 2, V6Len: v6}, NewManualClock(time.Now()))
		victim := netip.MustParseAddr("fe80::1%3")
		var b [16]byte
		b[0], b[1] = 0xfe, 0x80
		binary.BigEndian.PutUint32(b[2:6], zoneHash("2")^zoneHash("3")) // address bits 16–47
		b[15] = 1
		attacker := netip.AddrFrom16(b).WithZone("2")
		if !attacker.IsLinkLocalUnicast() {
			t.Fatalf("%v is not link-local", attacker)
		}
		for range 2 {
			if !l.Allow(attacker) {
				t.Fatalf("/%d: %v refused within its own burst", v6, attacker)
			}
		}
		if !l.Allow(victim) {
			t.Errorf("/%d: %v on link 3 refused after %v on link 2 spent its own burst: a host on one link aimed at another link's bucket", v6, victim, attacker)
		}
	}
}
