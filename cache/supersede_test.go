package cache

import (
	"errors"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// An answer the upstream gives now supersedes what the cache held for the
// name, even when it cannot be kept itself: a TTL of 0 ("use it once"), or
// a negative answer without an SOA. Kept, the old answer would come back
// as a stale answer once the upstream fails — data the upstream has since
// withdrawn or changed (RFC 8767 serves stale what was last known, not
// what was known before the last answer). An answer that says nothing
// about the name — SERVFAIL, REFUSED, FORMERR, a TC answer, one that does
// not read — leaves the entry as it is.
func TestAnswerThatCannotBeKeptStillSupersedesTheEntry(t *testing.T) {
	q := query("www.example.com.", dns.TypeA, wire.KeyRD)
	old := pack(t, answer(t, q, dns.RcodeSuccess, []string{"www.example.com. 60 IN A 192.0.2.1"}, nil, nil))
	tests := []struct {
		name    string
		reply   []byte
		err     error
		forgets bool
	}{
		{"TTL 0", pack(t, answer(t, q, dns.RcodeSuccess, []string{"www.example.com. 0 IN A 192.0.2.9"}, nil, nil)), ErrZeroTTL, true},
		{"NXDOMAIN without an SOA", pack(t, answer(t, q, dns.RcodeNameError, nil, nil, nil)), ErrNoSOA, true},
		{"NODATA without an SOA", pack(t, answer(t, q, dns.RcodeSuccess, nil, nil, nil)), ErrNoSOA, true},
		{"a CNAME chain short of the type, no SOA", pack(t, answer(t, q, dns.RcodeSuccess, []string{"www.example.com. 60 IN CNAME host.example.net."}, nil, nil)), ErrNoSOA, false},
		{"REFUSED", pack(t, answer(t, q, dns.RcodeRefused, nil, nil, nil)), ErrRcode, false},
		{"SERVFAIL", pack(t, answer(t, q, dns.RcodeServerFailure, nil, nil, nil)), ErrRcode, false},
		{"FORMERR", pack(t, answer(t, q, dns.RcodeFormatError, nil, nil, nil)), ErrRcode, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCache(t, Config{StaleWindow: time.Hour})
			k := keyOf(t, q)
			if err := c.Store(k, old, t0); err != nil {
				t.Fatal(err)
			}
			// The refresh, after expiry: the upstream's word now.
			if err := c.Store(k, tt.reply, at(61*time.Second)); !errors.Is(err, tt.err) {
				t.Fatalf("Store = %v, want %v", err, tt.err)
			}
			_, st := c.Lookup(k, at(62*time.Second))
			if forgot := st == Miss; forgot != tt.forgets {
				t.Errorf("after the upstream answered %s, the old answer is %v; want forgotten: %v", tt.name, st, tt.forgets)
			}
		})
	}
}
