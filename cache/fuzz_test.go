package cache

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// FuzzStore feeds arbitrary replies to Store, under the key of their own
// question (or a fixed one): it must never panic, and what it stores must
// come back, at any age, as records that walk as a message with the counts
// the hit gives, every TTL within the entry's, every name readable (TTLs
// counted down or set stale included: no pointer reaches them).
func FuzzStore(f *testing.F) {
	q := query("www.example.com.", dns.TypeA, wire.KeyRD|wire.KeyEDNS)
	for _, m := range []*dns.Msg{
		answer(f, q, dns.RcodeSuccess, []string{"www.example.com. 300 IN CNAME h.example.com.", "h.example.com. 60 IN A 192.0.2.1"},
			[]string{"example.com. 900 IN NS ns.example.com."}, []string{"ns.example.com. 100 IN A 192.0.2.53"}),
		answer(f, q, dns.RcodeNameError, nil, []string{soa}, nil),
		answer(f, q, dns.RcodeSuccess, nil, []string{soa}, nil),
		answer(f, q, dns.RcodeServerFailure, nil, nil, nil),
	} {
		m.SetEdns0(1232, true)
		f.Add(pack(f, m), uint32(0))
		f.Add(pack(f, m), uint32(400))
		if len(m.Answer) > 0 {
			f.Add(unreadable(f, pack(f, m)), uint32(0)) // a pointer at itself
		}
	}
	fixed := keyOf(f, q)
	c := newCache(f, Config{Size: MinSize, StaleWindow: time.Hour, MinTTL: time.Second, MaxNegativeTTL: time.Minute})
	f.Fuzz(func(t *testing.T, reply []byte, age uint32) {
		k := fixed
		if qend, ok := wire.QuestionEnd(reply); ok && len(reply) > 5 {
			k = new(wire.Key)
			if !k.Set(reply[wire.HeaderLen:qend], wire.KeyRD) {
				return
			}
		}
		c.Flush()
		if c.Store(k, reply, t0) != nil {
			return
		}
		now := at(time.Duration(age) * time.Second)
		h, st := c.Lookup(k, now)
		if st == Miss {
			return
		}
		// The reply had a question (else Store refuses); the answer is
		// built on it, as the proxy builds it on the client's.
		qend, _ := wire.QuestionEnd(reply)
		an, ns, ar := h.Counts()
		msg := append([]byte(nil), reply[:qend]...)
		wire.SetCounts(msg, 1, an, ns, ar)
		msg = h.AppendRecords(msg)
		sec, ok := wire.ReadSections(msg, qend)
		if !ok || sec.End != len(msg) || sec.AN != an || sec.NS != ns || sec.AR != ar || sec.OPT.Present {
			t.Fatalf("stored records do not walk as %d/%d/%d records: %+v", an, ns, ar, sec)
		}
		entryTTL := h.e.ttl
		off := qend
		for range an + ns + ar {
			off = skipName(msg, off)
			ttl := binary.BigEndian.Uint32(msg[off+4:])
			switch {
			case h.Stale() && ttl != StaleTTL:
				t.Fatalf("a stale record says %d", ttl)
			case !h.Stale() && h.Negative() && ttl > entryTTL:
				t.Fatalf("a negative answer's record says %d, over the entry's %d", ttl, entryTTL)
			case !h.Stale() && ttl > seconds(DefaultMaxTTL):
				t.Fatalf("a record says %d, over MaxTTL", ttl)
			}
			off += 10 + int(binary.BigEndian.Uint16(msg[off+8:]))
		}
		if !wire.NamesReadable(msg, qend, an+ns+ar) {
			t.Fatal("the answer built from the entry holds a name no client reads")
		}
		if !h.Stale() && (h.TTL() == 0 || h.TTL() > entryTTL) {
			t.Fatalf("fresh with TTL %d of %d", h.TTL(), entryTTL)
		}
	})
}
