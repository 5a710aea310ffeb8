package cache

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// unreadable is the good answer b with its first answer record's owner
// turned into a pointer at itself: the records still walk (wire.ReadSections
// follows no pointer), but no client can read the name.
func unreadable(t testing.TB, b []byte) []byte {
	t.Helper()
	qend, ok := wire.QuestionEnd(b)
	if !ok || b[qend]&0xC0 != 0xC0 {
		t.Fatal("the answer's first owner is not a pointer")
	}
	bad := append([]byte(nil), b...)
	binary.BigEndian.PutUint16(bad[qend:], 0xC000|uint16(qend))
	return bad
}

// TestRefreshWithUnreadableNamesKeepsTheEntry: an answer whose names do
// not read is never stored, and a refresh answered with one leaves the
// entry it would have replaced as it was: fresh or expired, its records
// still the good ones, still served stale.
func TestRefreshWithUnreadableNamesKeepsTheEntry(t *testing.T) {
	q := query("www.example.com.", dns.TypeA, wire.KeyRD)
	k := keyOf(t, q)
	good := pack(t, answer(t, q, dns.RcodeSuccess, []string{"www.example.com. 300 IN A 192.0.2.1"}, nil, nil))
	bad := unreadable(t, good)
	tests := []struct {
		name    string
		refresh time.Duration // when the refresh lands, after the good answer's store
		want    State
	}{
		{"fresh entry", 10 * time.Second, Fresh},
		{"expired entry", 301 * time.Second, Expired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCache(t, Config{Size: MinSize, StaleWindow: time.Hour})
			if err := c.Store(k, bad, t0); !errors.Is(err, ErrMalformed) {
				t.Fatalf("Store(unreadable) = %v, want ErrMalformed", err)
			}
			if _, st := c.Lookup(k, t0); st != Miss {
				t.Fatalf("an unreadable answer was stored: %v", st)
			}
			if err := c.Store(k, good, t0); err != nil {
				t.Fatal(err)
			}
			now := at(tt.refresh)
			if err := c.Store(k, bad, now); !errors.Is(err, ErrMalformed) {
				t.Fatalf("refresh Store(unreadable) = %v, want ErrMalformed", err)
			}
			h, st := c.Lookup(k, now)
			if st != tt.want {
				t.Fatalf("after the refresh: %v, want %v", st, tt.want)
			}
			var m dns.Msg
			if err := m.Unpack(build(t, h, pack(t, q))); err != nil || len(m.Answer) != 1 {
				t.Fatalf("the entry kept does not read as the good answer: %v %v", err, m.Answer)
			}
		})
	}
}
