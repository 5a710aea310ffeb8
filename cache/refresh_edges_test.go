package cache

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// A stale window of any length New accepts keeps a fresh entry found: New
// refuses only a negative window, so a window meant as "forever" must not
// make every entry dead the moment it is stored.
func TestHugeStaleWindowKeepsFreshEntries(t *testing.T) {
	for _, w := range []time.Duration{168 * time.Hour, 1 << 62, math.MaxInt64} {
		t.Run(w.String(), func(t *testing.T) {
			c, err := New(Config{Size: MinSize, StaleWindow: w})
			if err != nil {
				return // refused at New: fine too
			}
			q := query("www.example.com.", dns.TypeA, wire.KeyRD)
			k := keyOf(t, q)
			// A reading of the real clock, as the proxy's: past the
			// package's epoch, as every real reading is.
			now := time.Now()
			if err := c.Store(k, pack(t, answer(t, q, dns.RcodeSuccess, []string{"www.example.com. 300 IN A 192.0.2.1"}, nil, nil)), now); err != nil {
				t.Fatal(err)
			}
			if _, st := c.Lookup(k, now.Add(time.Second)); st != Fresh {
				t.Fatalf("StaleWindow %v accepted by New; a 300 s entry 1 s old: %v, want fresh", w, st)
			}
		})
	}
}

// Every record of a stored answer, whatever its section, its name's
// compression and its place among many, comes back with its own TTL
// (clamped as stored) less the entry's age, and nothing else changes:
// checked against miekg/dns's reading of the built answer, over random
// messages of up to 120 records with DNSSEC records and glue.
func TestEveryRecordCountedDown(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	deadline := time.Now().Add(2 * time.Second)
	for iter := 0; iter < 100 && time.Now().Before(deadline); iter++ {
		name := fmt.Sprintf("w%d.Example.COM.", iter)
		q := query(name, dns.TypeA, wire.KeyRD|wire.KeyEDNS|wire.KeyDO)
		n := func(k int) []string {
			var out []string
			for i := range k {
				ttl := 60 + r.IntN(200000)
				switch r.IntN(5) {
				case 0:
					out = append(out, fmt.Sprintf("%s %d IN A 192.0.2.%d", name, ttl, i%250))
				case 1:
					out = append(out, fmt.Sprintf("h%d.example.com. %d IN AAAA 2001:db8::%x", i, ttl, i))
				case 2:
					out = append(out, fmt.Sprintf("example.com. %d IN NS ns%d.example.com.", ttl, i))
				case 3:
					out = append(out, fmt.Sprintf("%s %d IN RRSIG A 13 3 300 20300101000000 20200101000000 12345 example.com. dGVzdA==", name, ttl))
				default:
					out = append(out, fmt.Sprintf("%s %d IN TXT \"%d\"", name, ttl, i))
				}
			}
			return out
		}
		an, ns, ar := n(1+r.IntN(40)), n(r.IntN(40)), n(r.IntN(40))
		// An A record among the answers: without one the answer is NODATA,
		// which needs an SOA to be stored.
		an[0] = fmt.Sprintf("%s %d IN A 192.0.2.1", name, 60+r.IntN(200000))
		m := answer(t, q, dns.RcodeSuccess, an, ns, ar)
		m.SetEdns0(1232, true)
		reply := pack(t, m)
		orig := new(dns.Msg)
		if err := orig.Unpack(reply); err != nil {
			t.Fatal(err)
		}
		c := newCache(t, Config{MaxTTL: 2 * 24 * time.Hour, StaleWindow: time.Hour})
		k := keyOf(t, q)
		if err := c.Store(k, reply, t0); err != nil {
			t.Fatalf("Store: %v", err)
		}
		least := uint32(math.MaxUint32)
		for _, rr := range append(append([]dns.RR{}, orig.Answer...), orig.Ns...) {
			least = min(least, rr.Header().Ttl)
		}
		least = min(least, 2*86400)
		age := uint32(r.IntN(int(least)))
		h, st := c.Lookup(k, at(time.Duration(age)*time.Second+999*time.Millisecond))
		if st != Fresh {
			t.Fatalf("age %d of %d: %v", age, least, st)
		}
		got := new(dns.Msg)
		if err := got.Unpack(build(t, h, pack(t, q))); err != nil {
			t.Fatal(err)
		}
		var want, have []dns.RR
		want = append(append(append(want, orig.Answer...), orig.Ns...), orig.Extra...)
		have = append(append(append(have, got.Answer...), got.Ns...), got.Extra...)
		want = want[:len(want)-1] // the OPT, last
		if len(have) != len(want) {
			t.Fatalf("%d records, want %d", len(have), len(want))
		}
		for i := range want {
			w := dns.Copy(want[i])
			w.Header().Ttl = min(w.Header().Ttl, 2*86400)
			w.Header().Ttl -= min(w.Header().Ttl, age) // glue below the entry's TTL stops at 0
			if w.String() != have[i].String() {
				t.Fatalf("record %d at age %d:\n got %s\nwant %s", i, age, have[i], w)
			}
		}
	}
}

// A refresh that fails after another refresh of the same name succeeded
// marks the entry that failed, not the fresh one stored meanwhile: in the
// proxy, a refresh whose stale-wait timer fired leaves the table, the next
// query refreshes again and stores a fresh answer, and then the first
// times out. The fresh entry was never refreshed and never failed; once it
// expires, the next query must ask (Expired), not be answered stale for
// what is left of a recheck timer started before the entry existed.
func TestRefreshFailedMarksOnlyTheEntryThatFailed(t *testing.T) {
	q := query("www.example.com.", dns.TypeA, wire.KeyRD|wire.KeyEDNS)
	k := keyOf(t, q)
	c := newCache(t, Config{StaleWindow: time.Hour})
	reply := func(ttl int) []byte {
		return pack(t, answer(t, q, dns.RcodeSuccess, []string{fmt.Sprintf("www.example.com. %d IN A 192.0.2.1", ttl)}, nil, nil))
	}
	if err := c.Store(k, reply(60), t0); err != nil {
		t.Fatal(err)
	}
	// At 61 s the entry is expired: refresh R1 goes out and hangs.
	h1, st := c.Lookup(k, at(61*time.Second))
	if st != Expired {
		t.Fatalf("at 61 s: %v, want expired", st)
	}
	// At 63 s R2, the next query's refresh, lands: a fresh answer, TTL 10.
	if err := c.Store(k, reply(10), at(63*time.Second)); err != nil {
		t.Fatal(err)
	}
	// At 63.2 s R1 times out: its refresh failed.
	h1.RefreshFailed(at(63*time.Second + 200*time.Millisecond))
	if _, st := c.Lookup(k, at(70*time.Second)); st != Fresh {
		t.Fatalf("at 70 s: %v, want fresh", st)
	}
	// At 74 s R2's answer has expired; no refresh of it has failed.
	if h, st := c.Lookup(k, at(74*time.Second)); st != Expired {
		t.Fatalf("at 74 s, the fresh answer stored at 63 s expired, no refresh of it tried: %v (stale %v), want expired: it would be answered stale without asking until 93.2 s", st, h.Stale())
	}
}
