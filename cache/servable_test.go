package cache

import (
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// Servable ends where Lookup stops finding the entry: at expiry + the
// stale window, to the nanosecond, however old the Hit asked about; a
// zero Hit is never servable.
func TestServableEndsWithTheStaleWindow(t *testing.T) {
	c := newCache(t, Config{StaleWindow: 10 * time.Minute})
	h, k := expiredHit(t, c)
	end := 60*time.Second + 10*time.Minute
	tests := []struct {
		at   time.Duration
		want bool
	}{
		{0, true},
		{61 * time.Second, true},
		{end - time.Nanosecond, true},
		{end, false},
		{end + 800*time.Millisecond, false},
	}
	for _, tt := range tests {
		if got := c.Servable(h, at(tt.at)); got != tt.want {
			t.Errorf("Servable at %v: %v, want %v", tt.at, got, tt.want)
		}
		if _, st := c.Lookup(k, at(tt.at)); (st != Miss) != tt.want {
			t.Errorf("Lookup at %v: %v, and Servable %v: they disagree", tt.at, st, tt.want)
		}
	}
	if c.Servable(Hit{}, t0) {
		t.Error("the zero Hit is servable")
	}
}

// expiredHit stores www.example.com A with a TTL of 60 s at t0 in c and
// returns what Lookup finds 61 s later, Expired (the Hit a refresh carries),
// and the name's key.
func expiredHit(t *testing.T, c *Cache) (Hit, *wire.Key) {
	t.Helper()
	q := query("www.example.com.", dns.TypeA, 0)
	k := keyOf(t, q)
	if err := c.Store(k, pack(t, answer(t, q, dns.RcodeSuccess, []string{"www.example.com. 60 IN A 192.0.2.1"}, nil, nil)), t0); err != nil {
		t.Fatal(err)
	}
	h, st := c.Lookup(k, at(61*time.Second))
	if st != Expired {
		t.Fatalf("state %v, want expired", st)
	}
	return h, k
}
