package cache

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// t0 is where every test's timeline starts.
var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// at returns t0 plus d.
func at(d time.Duration) time.Time { return t0.Add(d) }

// newCache returns a cache of cfg, Size 1 MiB unless set.
func newCache(t testing.TB, cfg Config) *Cache {
	t.Helper()
	if cfg.Size == 0 {
		cfg.Size = 1 << 20
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// query returns a query for name and qtype with the header bits of key
// bits: RD, CD, and an OPT with DO when asked.
func query(name string, qtype uint16, bits byte) *dns.Msg {
	q := new(dns.Msg).SetQuestion(name, qtype)
	q.RecursionDesired = bits&wire.KeyRD != 0
	q.CheckingDisabled = bits&wire.KeyCD != 0
	if bits&(wire.KeyEDNS|wire.KeyDO) != 0 {
		q.SetEdns0(1232, bits&wire.KeyDO != 0)
	}
	return q
}

// keyOf returns the key of q, as the proxy sets it.
func keyOf(t testing.TB, q *dns.Msg) *wire.Key {
	t.Helper()
	b := pack(t, q)
	qend, ok := wire.QuestionEnd(b)
	if !ok {
		t.Fatal("no question")
	}
	var bits byte
	if q.RecursionDesired {
		bits |= wire.KeyRD
	}
	if q.CheckingDisabled {
		bits |= wire.KeyCD
	}
	if o := q.IsEdns0(); o != nil {
		bits |= wire.KeyEDNS
		if o.Do() {
			bits |= wire.KeyDO
		}
	}
	k := new(wire.Key)
	if !k.Set(b[wire.HeaderLen:qend], bits) {
		t.Fatal("key not set")
	}
	return k
}

// answer returns a reply to q with the records rrs (zone-file lines) in
// the answer, authority and additional sections, and rcode.
func answer(t testing.TB, q *dns.Msg, rcode int, an, ns, ar []string) *dns.Msg {
	t.Helper()
	r := new(dns.Msg).SetRcode(q, rcode)
	r.RecursionAvailable = true
	for _, sec := range []struct {
		lines []string
		to    *[]dns.RR
	}{{an, &r.Answer}, {ns, &r.Ns}, {ar, &r.Extra}} {
		for _, l := range sec.lines {
			rr, err := dns.NewRR(l)
			if err != nil {
				t.Fatalf("%q: %v", l, err)
			}
			*sec.to = append(*sec.to, rr)
		}
	}
	return r
}

func pack(t testing.TB, m *dns.Msg) []byte {
	t.Helper()
	m.Compress = true
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// build returns the message a proxy builds from h for the client query q:
// q's ID and question as sent, the stored flags and records, no OPT.
func build(t testing.TB, h Hit, q []byte) []byte {
	t.Helper()
	qend, ok := wire.QuestionEnd(q)
	if !ok {
		t.Fatal("no question")
	}
	an, ns, ar := h.Counts()
	msg := make([]byte, wire.HeaderLen, 512)
	wire.SetID(msg, wire.ID(q))
	wire.SetFlags(msg, h.Flags()|wire.FlagQR)
	wire.SetCounts(msg, 1, an, ns, ar)
	msg = append(msg, q[wire.HeaderLen:qend]...)
	return h.AppendRecords(msg)
}

// ttls returns the TTL of every record in msg, in order.
func ttls(t testing.TB, msg []byte) []uint32 {
	t.Helper()
	m := new(dns.Msg)
	if err := m.Unpack(msg); err != nil {
		t.Fatalf("answer does not unpack: %v", err)
	}
	var out []uint32
	for _, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			out = append(out, rr.Header().Ttl)
		}
	}
	return out
}

// setTTL sets the TTL of the first record of the reply b to ttl.
func setTTL(t testing.TB, b []byte, ttl uint32) []byte {
	t.Helper()
	qend, _ := wire.QuestionEnd(b)
	off := skipName(b, qend)
	binary.BigEndian.PutUint32(b[off+4:], ttl)
	return b
}
