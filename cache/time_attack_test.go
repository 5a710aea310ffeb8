package cache

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// A NOERROR answer whose answer section holds only the CNAME chain, none
// of the type asked for, is NODATA (RFC 2308 §2.2: "It may also contain a
// CNAME chain in the answer section"): a negative answer, so its TTL is
// capped by MaxNegativeTTL (DNS_CACHE_MAX_NEGATIVE_TTL), and without an SOA
// it is not stored at all (RFC 2308 §5), as a NODATA with no chain is not.
func TestTimeNoDataAfterCNAMEIsNegative(t *testing.T) {
	q := query("www.example.com.", dns.TypeAAAA, wire.KeyRD)
	cname := []string{"www.example.com. 86400 IN CNAME h.example.net."}
	t.Run("clamped by MaxNegativeTTL", func(t *testing.T) {
		reply := pack(t, answer(t, q, dns.RcodeSuccess, cname,
			[]string{"example.net. 86400 IN SOA ns.example.net. host.example.net. 1 7200 900 1209600 86400"}, nil))
		c := newCache(t, Config{}) // MaxNegativeTTL 1 h, MaxTTL 1 day
		k := keyOf(t, q)
		if err := c.Store(k, reply, t0); err != nil {
			t.Fatal(err)
		}
		h, st := c.Lookup(k, t0)
		if st != Fresh || h.TTL() > uint32(DefaultMaxNegativeTTL/time.Second) || !h.Negative() {
			t.Fatalf("NODATA after a CNAME: %v, TTL %d, negative %v; want fresh, TTL at most %d (MaxNegativeTTL), negative",
				st, h.TTL(), h.Negative(), DefaultMaxNegativeTTL/time.Second)
		}
		if _, st := c.Lookup(k, t0.Add(DefaultMaxNegativeTTL)); st != Miss {
			t.Fatalf("NODATA after a CNAME, MaxNegativeTTL later: %v, want a miss", st)
		}
	})
	t.Run("not stored without an SOA", func(t *testing.T) {
		reply := pack(t, answer(t, q, dns.RcodeSuccess, cname, nil, nil))
		if err := newCache(t, Config{}).Store(keyOf(t, q), reply, t0); !errors.Is(err, ErrNoSOA) {
			t.Fatalf("NODATA after a CNAME without an SOA: Store: %v, want ErrNoSOA", err)
		}
	})
}

// From its store to its expiry an entry's records count down and never
// up, never above what the upstream gave (clamped), and expire exactly
// at the entry's TTL: at TTLs at the edges, an RRset whose records differ,
// and an RRSIG beside its RRset, which must read the same TTL at every age
// and never more than its Original TTL (RFC 4035 §5.3.3).
func TestTimeCountDownNeverRisesNorPassesTheUpstreams(t *testing.T) {
	const most = maxTTL * time.Second
	tests := []struct {
		ttl    uint32 // of every record
		maxTTL time.Duration
		want   uint32 // the entry's TTL
	}{
		{1, 0, 1}, {2, 0, 2}, {10, 0, 10}, {300, 0, 300},
		{1<<31 - 1, most, 1<<31 - 1}, {1 << 31, most, 1<<31 - 1}, {1<<32 - 1, most, 1<<31 - 1},
		{1<<32 - 1, 0, 86400}, {300, time.Second, 1},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("TTL %d MaxTTL %v", tt.ttl, tt.maxTTL), func(t *testing.T) {
			q := query("www.example.com.", dns.TypeA, wire.KeyRD|wire.KeyEDNS|wire.KeyDO)
			r := answer(t, q, dns.RcodeSuccess, []string{
				"www.example.com. 1 IN A 192.0.2.1",
				"www.example.com. 1 IN A 192.0.2.2",
				"www.example.com. 1 IN RRSIG A 8 3 1 20300101000000 20200101000000 1 example.com. AAAA",
			}, nil, nil)
			for _, rr := range r.Answer {
				rr.Header().Ttl = tt.ttl
			}
			r.Answer[1].Header().Ttl = min(tt.ttl, 1<<31-1) + 7 // the RRset's records differ; below 2^31 + 7
			r.Answer[2].(*dns.RRSIG).OrigTtl = min(tt.ttl, 1<<31-1)
			c := newCache(t, Config{MaxTTL: tt.maxTTL, StaleWindow: time.Hour})
			k := keyOf(t, q)
			if err := c.Store(k, pack(t, r), t0); err != nil {
				t.Fatal(err)
			}
			life := time.Duration(tt.want) * time.Second
			ages := []time.Duration{0, 1, 999 * time.Millisecond, time.Second - 1, time.Second, time.Second + 1,
				1999 * time.Millisecond, life / 2, life - time.Second - 1, life - time.Second, life - 1}
			slices.Sort(ages)
			client := pack(t, q)
			var last, base []uint32
			for _, age := range ages {
				if age < 0 || age >= life {
					continue
				}
				h, st := c.Lookup(k, at(age))
				if st != Fresh {
					t.Fatalf("at %v: %v, want fresh", age, st)
				}
				got := ttls(t, build(t, h, client))
				if base == nil {
					base = got // age 0
					if got[0] != tt.want {
						t.Fatalf("at store: TTLs %v, want the first %d", got, tt.want)
					}
				}
				for i, v := range got {
					if want := base[i] - uint32(age/time.Second); v != want {
						t.Fatalf("at %v: TTLs %v, want %v less %d s each", age, got, base, age/time.Second)
					}
				}
				limit := min(tt.want, r.Answer[2].(*dns.RRSIG).OrigTtl)
				for i, v := range got {
					if v == 0 || (i != 1 && v > limit) || (last != nil && v > last[i]) {
						t.Fatalf("at %v: TTLs %v (before %v): want each in [1, %d], none rising", age, got, last, limit)
					}
				}
				if got[0] != got[2] {
					t.Fatalf("at %v: the A record says %d, its RRSIG %d", age, got[0], got[2])
				}
				last = got
			}
			if _, st := c.Lookup(k, at(life)); st != Expired {
				t.Fatalf("at its TTL exactly: %v, want expired", st)
			}
		})
	}
}

// Prefetch for the shortest TTLs: the one hit from the last tenth of the
// TTL on, not a nanosecond before, asks for it, and only once.
func TestTimePrefetchInTheLastTenthOfShortTTLs(t *testing.T) {
	for ttl := 1; ttl <= 10; ttl++ {
		t.Run(fmt.Sprint(ttl), func(t *testing.T) {
			q := query("www.example.com.", dns.TypeA, wire.KeyRD)
			reply := pack(t, answer(t, q, dns.RcodeSuccess, []string{fmt.Sprintf("www.example.com. %d IN A 192.0.2.1", ttl)}, nil, nil))
			c := newCache(t, Config{Prefetch: true})
			k := keyOf(t, q)
			if err := c.Store(k, reply, t0); err != nil {
				t.Fatal(err)
			}
			tenth := time.Duration(ttl) * time.Second / 10
			life := time.Duration(ttl) * time.Second
			for _, step := range []struct {
				at   time.Duration
				want bool
			}{{0, false}, {life - tenth - 1, false}, {life - tenth, true}, {life - tenth + 1, false}, {life - 1, false}} {
				h, st := c.Lookup(k, at(step.at))
				if st != Fresh || h.Prefetch() != step.want {
					t.Fatalf("at %v: %v, prefetch %v; want fresh, %v", step.at, st, h.Prefetch(), step.want)
				}
			}
		})
	}
}

// The stale window's edges: 0 ends the entry at its expiry; 1 ns keeps it
// for that one nanosecond, expired, and a refresh that fails then finds it
// unservable a nanosecond later.
func TestTimeStaleWindowEdges(t *testing.T) {
	q := query("www.example.com.", dns.TypeA, wire.KeyRD)
	reply := pack(t, answer(t, q, dns.RcodeSuccess, []string{"www.example.com. 60 IN A 192.0.2.1"}, nil, nil))
	life := 60 * time.Second
	for _, tt := range []struct {
		window time.Duration
		steps  []struct {
			at   time.Duration
			want State
		}
	}{
		{0, []struct {
			at   time.Duration
			want State
		}{{life - 1, Fresh}, {life, Miss}}},
		{1, []struct {
			at   time.Duration
			want State
		}{{life - 1, Fresh}, {life, Expired}, {life + 1, Miss}}},
		{time.Second, []struct {
			at   time.Duration
			want State
		}{{life, Expired}, {life + time.Second - 1, Expired}, {life + time.Second, Miss}}},
	} {
		t.Run(tt.window.String(), func(t *testing.T) {
			c := newCache(t, Config{StaleWindow: tt.window})
			k := keyOf(t, q)
			if err := c.Store(k, reply, t0); err != nil {
				t.Fatal(err)
			}
			for _, s := range tt.steps {
				h, st := c.Lookup(k, at(s.at))
				if st != s.want {
					t.Fatalf("at %v: %v, want %v", s.at, st, s.want)
				}
				if st == Expired && (c.Servable(h, at(life+tt.window)) || !c.Servable(h, at(life+tt.window-1))) {
					t.Fatalf("at %v: servable at the window's end, or not just before it", s.at)
				}
			}
		})
	}
}
