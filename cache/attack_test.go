package cache

import (
	"errors"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// RFC 8767 §4, which the cache implements for serve-stale and which updates
// RFC 2181, reads a TTL with its high-order bit set as a large positive
// value, to be capped (as at MaxTTL), not as 0: "Interpreting values that
// have the high-order bit set as being positive, rather than 0, is a change
// from [RFC2181]". Such an answer is cached for MaxTTL.
func TestTTLWithTheTopBitSetIsCappedNotZero(t *testing.T) {
	q := query("www.example.com.", dns.TypeA, wire.KeyRD)
	k := keyOf(t, q)
	c := newCache(t, Config{MaxTTL: time.Hour})
	reply := setTTL(t, pack(t, answer(t, q, dns.RcodeSuccess, []string{"www.example.com. 300 IN A 192.0.2.1"}, nil, nil)), 1<<31)
	if err := c.Store(k, reply, t0); err != nil {
		t.Fatalf("Store: %v (ErrZeroTTL: %v), want it stored, its TTL capped at MaxTTL", err, errors.Is(err, ErrZeroTTL))
	}
	h, st := c.Lookup(k, t0)
	if st != Fresh || h.TTL() != 3600 {
		t.Fatalf("%v with TTL %d, want fresh with 3600 (MaxTTL)", st, h.TTL())
	}
}

// A timeline of stores, lookups, failed refreshes and flushes over keys
// that share a few hashes (so entries replace one another in the index)
// agrees at every step with a plain map of what was stored last under each
// key: the state (fresh, expired, stale, miss), the TTL, and the records
// are the key's own. The cache is large enough that nothing is evicted for
// room; an entry leaves only when another key of its hash is stored.
func TestCollidingKeysAgreeWithAModel(t *testing.T) {
	type model struct {
		stored  time.Time
		ttl     uint32
		ip      byte
		recheck time.Time
		hash    uint64
	}
	const window = time.Minute
	c := newCache(t, Config{Size: 4 << 20, StaleWindow: window})
	names := []string{"a.example.", "b.example.", "c.example.", "d.example.", "long-x0123456789012345678901234567890123456789.example.", "long-x0123456789012345678901234567890123456780.example."}
	hashes := []uint64{1 << 20, 3 << 20, 0} // the same shard, few slots; 0 as an empty slot's hash
	type kk struct {
		k *wire.Key
		q *dns.Msg
	}
	var keys []kk
	for i, n := range names {
		q := query(n, dns.TypeA, wire.KeyRD)
		k := keyOf(t, q)
		k.Hash = hashes[i%len(hashes)]
		keys = append(keys, kk{k, q})
	}
	m := map[int]*model{}
	now := t0
	seed := uint64(12345)
	rnd := func(n int) int {
		seed ^= seed << 13
		seed ^= seed >> 7
		seed ^= seed << 17
		return int(seed % uint64(n))
	}
	for step := range 20000 {
		i := rnd(len(keys))
		k := keys[i]
		switch op := rnd(10); {
		case op < 3:
			ttl := uint32(1 + rnd(30))
			ip := byte(rnd(250))
			r := answer(t, k.q, dns.RcodeSuccess, []string{k.q.Question[0].Name + " 1 IN A 192.0.2." + itoa(int(ip))}, nil, nil)
			r.Answer[0].Header().Ttl = ttl
			if err := c.Store(k.k, pack(t, r), now); err != nil {
				t.Fatal(err)
			}
			for j, e := range m {
				if e.hash == k.k.Hash {
					delete(m, j)
				}
			}
			m[i] = &model{stored: now, ttl: ttl, ip: ip, hash: k.k.Hash}
		case op < 8:
			h, st := c.Lookup(k.k, now)
			e := m[i]
			want := Miss
			if e != nil {
				exp := e.stored.Add(time.Duration(e.ttl) * time.Second)
				switch {
				case now.Before(exp):
					want = Fresh
				case now.Sub(exp) >= window:
					want = Miss
				case now.Before(e.recheck):
					want = Stale
				default:
					want = Expired
				}
			}
			if st != want {
				t.Fatalf("step %d, key %d: %v, want %v", step, i, st, want)
			}
			if st == Miss {
				continue
			}
			msg := build(t, h, pack(t, k.q))
			r := new(dns.Msg)
			if err := r.Unpack(msg); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			a, ok := r.Answer[0].(*dns.A)
			if !ok || a.A[3] != e.ip || a.Hdr.Name != k.q.Question[0].Name {
				t.Fatalf("step %d, key %d: answer %v, want %s 192.0.2.%d", step, i, r.Answer[0], k.q.Question[0].Name, e.ip)
			}
			if st == Fresh {
				age := uint32(now.Sub(e.stored) / time.Second)
				if a.Hdr.Ttl != e.ttl-age {
					t.Fatalf("step %d: TTL %d, want %d", step, a.Hdr.Ttl, e.ttl-age)
				}
			} else if a.Hdr.Ttl != StaleTTL {
				t.Fatalf("step %d: stale TTL %d", step, a.Hdr.Ttl)
			}
			if st == Expired && rnd(2) == 0 {
				h.RefreshFailed(now)
				e.recheck = now.Add(RecheckAfter)
			}
		case op < 9:
			now = now.Add(time.Duration(rnd(20000)) * time.Millisecond)
		default:
			if rnd(50) == 0 {
				c.Flush()
				clear(m)
			}
		}
	}
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}
