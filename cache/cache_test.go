package cache

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

func TestCountDown(t *testing.T) {
	q := query("www.example.com.", dns.TypeA, wire.KeyRD|wire.KeyEDNS|wire.KeyDO)
	r := answer(t, q, dns.RcodeSuccess,
		[]string{"www.example.com. 300 IN CNAME h.example.com.", "h.example.com. 600 IN A 192.0.2.1"},
		[]string{"example.com. 900 IN NS ns.example.com."},
		[]string{"ns.example.com. 100 IN A 192.0.2.53"})
	r.SetEdns0(1232, true)
	reply := pack(t, r)
	c := newCache(t, Config{StaleWindow: time.Hour})
	k := keyOf(t, q)
	if err := c.Store(k, reply, t0); err != nil {
		t.Fatal(err)
	}
	client := pack(t, q)
	tests := []struct {
		age   time.Duration
		state State
		ttls  []uint32
	}{
		{0, Fresh, []uint32{300, 600, 900, 100}},
		{99*time.Second + 900*time.Millisecond, Fresh, []uint32{201, 501, 801, 1}},
		{100 * time.Second, Fresh, []uint32{200, 500, 800, 0}},
		{299*time.Second + 999*time.Millisecond, Fresh, []uint32{1, 301, 601, 0}},
		{300 * time.Second, Expired, []uint32{30, 30, 30, 30}},
		{time.Hour + 299*time.Second, Expired, []uint32{30, 30, 30, 30}},
	}
	for _, tt := range tests {
		t.Run(tt.age.String(), func(t *testing.T) {
			h, st := c.Lookup(k, at(tt.age))
			if st != tt.state {
				t.Fatalf("state %v, want %v", st, tt.state)
			}
			msg := build(t, h, client)
			if got := ttls(t, msg); !slices.Equal(got, tt.ttls) {
				t.Fatalf("TTLs %v, want %v", got, tt.ttls)
			}
			// Only TTL fields differ from the reply's records, which lay
			// at the same offsets; the OPT is not among them.
			qend, _ := wire.QuestionEnd(reply)
			sec, _ := wire.ReadSections(reply, qend)
			want, got := reply[qend:sec.OPTStart], msg[qend:]
			if len(got) != len(want) {
				t.Fatalf("records of %d bytes, want %d", len(got), len(want))
			}
			masked := func(b []byte) []byte {
				b = slices.Clone(b)
				offs := h.e.offsets()
				for i := 0; i < len(offs); i += 2 {
					copy(b[binary.BigEndian.Uint16(offs[i:]):], []byte{0, 0, 0, 0})
				}
				return b
			}
			if !bytes.Equal(masked(got), masked(want)) {
				t.Fatalf("bytes besides the TTLs changed:\n%x\n%x", got, want)
			}
		})
	}
	if _, st := c.Lookup(k, at(time.Hour+300*time.Second)); st != Miss {
		t.Fatalf("past the stale window: %v, want a miss", st)
	}
}

func TestNegativeRecordsSayTheEntrysTTL(t *testing.T) {
	q := query("nx.example.com.", dns.TypeA, wire.KeyRD)
	r := answer(t, q, dns.RcodeNameError, nil, []string{
		"example.com. 3600 IN SOA ns.example.com. host.example.com. 1 7200 900 1209600 60",
		"example.com. 3600 IN NSEC a.example.com. A NS SOA RRSIG NSEC",
	}, nil)
	c := newCache(t, Config{})
	k := keyOf(t, q)
	if err := c.Store(k, pack(t, r), t0); err != nil {
		t.Fatal(err)
	}
	h, _ := c.Lookup(k, at(10*time.Second))
	if got := ttls(t, build(t, h, pack(t, q))); !slices.Equal(got, []uint32{50, 50}) {
		t.Fatalf("TTLs %v, want [50 50]: a negative answer lives min(SOA TTL, MINIMUM)", got)
	}
}

func TestCaseIsTheClients(t *testing.T) {
	stored := query("www.Example.COM.", dns.TypeA, wire.KeyRD)
	c := newCache(t, Config{})
	if err := c.Store(keyOf(t, stored), pack(t, answer(t, stored, dns.RcodeSuccess,
		[]string{"www.Example.COM. 300 IN A 192.0.2.1"}, nil, nil)), t0); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"www.example.com.", "WWW.EXAMPLE.COM.", "wWw.eXaMpLe.CoM."} {
		q := query(name, dns.TypeA, wire.KeyRD)
		h, st := c.Lookup(keyOf(t, q), t0)
		if st != Fresh {
			t.Fatalf("%s: %v, want fresh", name, st)
		}
		client := pack(t, q)
		msg := build(t, h, client)
		qend, _ := wire.QuestionEnd(client)
		if !bytes.Equal(msg[wire.HeaderLen:qend], client[wire.HeaderLen:qend]) || wire.ID(msg) != wire.ID(client) {
			t.Fatalf("%s: question or ID not the client's", name)
		}
		m := new(dns.Msg)
		if err := m.Unpack(msg); err != nil {
			t.Fatal(err)
		}
		if got := m.Answer[0].Header().Name; got != name {
			t.Fatalf("answer's owner %q, want %q: compressed to the client's question", got, name)
		}
	}
}

func TestKeyBitsSeparate(t *testing.T) {
	all := []byte{0, wire.KeyRD, wire.KeyCD, wire.KeyEDNS, wire.KeyEDNS | wire.KeyDO, wire.KeyRD | wire.KeyEDNS | wire.KeyDO | wire.KeyCD}
	c := newCache(t, Config{})
	for i, bits := range all {
		q := query("www.example.com.", dns.TypeA, bits)
		r := answer(t, q, dns.RcodeSuccess, []string{"www.example.com. 300 IN A 192.0.2." + string(rune('1'+i))}, nil, nil)
		if err := c.Store(keyOf(t, q), pack(t, r), t0); err != nil {
			t.Fatal(err)
		}
	}
	for i, bits := range all {
		q := query("www.example.com.", dns.TypeA, bits)
		h, st := c.Lookup(keyOf(t, q), t0)
		if st != Fresh {
			t.Fatalf("bits %04b: %v", bits, st)
		}
		m := new(dns.Msg)
		if err := m.Unpack(build(t, h, pack(t, q))); err != nil {
			t.Fatal(err)
		}
		if got, want := m.Answer[0].(*dns.A).A.String(), "192.0.2."+string(rune('1'+i)); got != want {
			t.Fatalf("bits %04b: answer %s, want %s (another key's)", bits, got, want)
		}
	}
	if _, st := c.Lookup(keyOf(t, query("www.example.com.", dns.TypeAAAA, 0)), t0); st != Miss {
		t.Fatalf("another type: %v, want a miss", st)
	}
}

func TestStaleTimeline(t *testing.T) {
	q := query("www.example.com.", dns.TypeA, wire.KeyRD)
	reply := pack(t, answer(t, q, dns.RcodeSuccess, []string{"www.example.com. 60 IN A 192.0.2.1"}, nil, nil))
	type step struct {
		at     time.Duration
		do     string // "lookup", "fail" (RefreshFailed), "store"
		want   State
		ttl    uint32
		isStal bool
	}
	tests := []struct {
		name  string
		cfg   Config
		steps []step
	}{
		{"stale off: expiry is a miss", Config{}, []step{
			{59 * time.Second, "lookup", Fresh, 1, false},
			{60 * time.Second, "lookup", Miss, 0, false},
		}},
		{"refresh first, stale after it fails, recheck after 30 s", Config{StaleWindow: time.Hour}, []step{
			{60 * time.Second, "lookup", Expired, 30, true},
			{61 * time.Second, "fail", 0, 0, false},
			{62 * time.Second, "lookup", Stale, 30, true},
			{90*time.Second + 999*time.Millisecond, "lookup", Stale, 30, true},
			{91 * time.Second, "lookup", Expired, 30, true},
			{92 * time.Second, "fail", 0, 0, false},
			{121 * time.Second, "lookup", Stale, 30, true},
			{122 * time.Second, "lookup", Expired, 30, true},
			{60*time.Second + time.Hour - 1, "lookup", Expired, 30, true},
			{60*time.Second + time.Hour, "lookup", Miss, 0, false},
		}},
		{"a refresh stored ends the recheck", Config{StaleWindow: time.Hour}, []step{
			{70 * time.Second, "fail", 0, 0, false},
			{71 * time.Second, "lookup", Stale, 30, true},
			{72 * time.Second, "store", 0, 0, false},
			{73 * time.Second, "lookup", Fresh, 59, false},
			{132 * time.Second, "lookup", Expired, 30, true},
		}},
		{"a failed refresh of a fresh entry (prefetch) holds past expiry", Config{StaleWindow: time.Hour}, []step{
			{55 * time.Second, "fail", 0, 0, false},
			{56 * time.Second, "lookup", Fresh, 4, false},
			{60 * time.Second, "lookup", Stale, 30, true},
			{85 * time.Second, "lookup", Expired, 30, true},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCache(t, tt.cfg)
			k := keyOf(t, q)
			if err := c.Store(k, reply, t0); err != nil {
				t.Fatal(err)
			}
			for _, s := range tt.steps {
				switch s.do {
				case "fail":
					c.RefreshFailed(k, at(s.at))
				case "store":
					if err := c.Store(k, reply, at(s.at)); err != nil {
						t.Fatal(err)
					}
				default:
					h, st := c.Lookup(k, at(s.at))
					if st != s.want {
						t.Fatalf("at %v: %v, want %v", s.at, st, s.want)
					}
					if st != Miss && (h.TTL() != s.ttl || h.Stale() != s.isStal) {
						t.Fatalf("at %v: TTL %d stale %v, want %d %v", s.at, h.TTL(), h.Stale(), s.ttl, s.isStal)
					}
				}
			}
		})
	}
}

func TestRefreshFailedOnAnotherKeyTouchesNothing(t *testing.T) {
	c := newCache(t, Config{StaleWindow: time.Hour})
	q := query("www.example.com.", dns.TypeA, wire.KeyRD)
	k := keyOf(t, q)
	if err := c.Store(k, pack(t, answer(t, q, dns.RcodeSuccess, []string{"www.example.com. 60 IN A 192.0.2.1"}, nil, nil)), t0); err != nil {
		t.Fatal(err)
	}
	c.RefreshFailed(keyOf(t, query("www.example.com.", dns.TypeA, 0)), at(61*time.Second))
	if _, st := c.Lookup(k, at(62*time.Second)); st != Expired {
		t.Fatalf("%v, want expired: the failure was another key's", st)
	}
}

func TestPrefetchFiresOnce(t *testing.T) {
	q := query("www.example.com.", dns.TypeA, wire.KeyRD)
	reply := pack(t, answer(t, q, dns.RcodeSuccess, []string{"www.example.com. 100 IN A 192.0.2.1"}, nil, nil))
	tests := []struct {
		name     string
		prefetch bool
		steps    []time.Duration // lookups; the ones in want ask for a prefetch
		want     []bool
	}{
		{"on", true,
			[]time.Duration{0, 89 * time.Second, 89*time.Second + 999*time.Millisecond, 90 * time.Second, 91 * time.Second, 99 * time.Second},
			[]bool{false, false, false, true, false, false}},
		{"first in the last tenth, late", true,
			[]time.Duration{10 * time.Second, 99*time.Second + 999*time.Millisecond},
			[]bool{false, true}},
		{"off", false, []time.Duration{90 * time.Second, 95 * time.Second}, []bool{false, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCache(t, Config{Prefetch: tt.prefetch, StaleWindow: time.Hour})
			k := keyOf(t, q)
			if err := c.Store(k, reply, t0); err != nil {
				t.Fatal(err)
			}
			for i, d := range tt.steps {
				h, st := c.Lookup(k, at(d))
				if st != Fresh || h.Prefetch() != tt.want[i] {
					t.Fatalf("at %v: %v, prefetch %v; want fresh, %v", d, st, h.Prefetch(), tt.want[i])
				}
			}
			if h, st := c.Lookup(k, at(100*time.Second)); st != Expired || h.Prefetch() {
				t.Fatalf("expired: %v, prefetch %v; a stale hit never prefetches", st, h.Prefetch())
			}
		})
	}
	t.Run("again after the refresh is stored", func(t *testing.T) {
		c := newCache(t, Config{Prefetch: true})
		k := keyOf(t, q)
		for i, d := range []time.Duration{0, 95 * time.Second} {
			if err := c.Store(k, reply, at(d)); err != nil {
				t.Fatal(err)
			}
			if h, _ := c.Lookup(k, at(d+95*time.Second)); !h.Prefetch() {
				t.Fatalf("store %d: no prefetch in its last tenth", i)
			}
		}
	})
}

func TestStaleEDE(t *testing.T) {
	tests := []struct {
		name   string
		rcode  int
		an, ns []string
		want   uint16
	}{
		{"answer", dns.RcodeSuccess, []string{"www.example.com. 60 IN A 192.0.2.1"}, nil, EDEStaleAnswer},
		{"NODATA", dns.RcodeSuccess, nil, []string{soa}, EDEStaleAnswer},
		{"NXDOMAIN", dns.RcodeNameError, nil, []string{soa}, EDEStaleNXDomain},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := query("www.example.com.", dns.TypeA, wire.KeyRD|wire.KeyEDNS)
			c := newCache(t, Config{StaleWindow: time.Hour})
			k := keyOf(t, q)
			if err := c.Store(k, pack(t, answer(t, q, tt.rcode, tt.an, tt.ns, nil)), t0); err != nil {
				t.Fatal(err)
			}
			h, st := c.Lookup(k, at(time.Hour))
			if st != Expired || h.StaleEDE() != tt.want {
				t.Fatalf("%v, EDE %d; want expired, %d", st, h.StaleEDE(), tt.want)
			}
			// The option, in the proxy's OPT, reads back as that EDE.
			opt := wire.AppendOPT(nil, 1232, 0, false, h.AppendStaleEDE(nil))
			m := new(dns.Msg).SetQuestion("x.", dns.TypeA)
			b, _ := m.Pack()
			wire.SetCounts(b, 1, 0, 0, 1)
			if err := m.Unpack(append(b, opt...)); err != nil {
				t.Fatal(err)
			}
			ede, ok := m.IsEdns0().Option[0].(*dns.EDNS0_EDE)
			if !ok || ede.InfoCode != tt.want || ede.ExtraText != "" {
				t.Fatalf("option %v, want EDE %d", m.IsEdns0().Option, tt.want)
			}
		})
	}
}

func TestFlush(t *testing.T) {
	c := newCache(t, Config{})
	var keys []*wire.Key
	for i := range 100 {
		q := query(strings.Repeat("a", i%60+1)+".example.com.", dns.TypeA, byte(i/60))
		k := keyOf(t, q)
		if err := c.Store(k, pack(t, answer(t, q, dns.RcodeSuccess, []string{q.Question[0].Name + " 60 IN A 192.0.2.1"}, nil, nil)), t0); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if st := c.Stats(); st.Entries != 100 {
		t.Fatalf("%d entries, want 100", st.Entries)
	}
	c.Flush()
	for _, k := range keys {
		if _, st := c.Lookup(k, t0); st != Miss {
			t.Fatalf("after Flush: %v", st)
		}
	}
	st := c.Stats()
	reserved := int64(0)
	for i := range c.shards {
		reserved += c.shards[i].reserved()
	}
	if st.Entries != 0 || st.Bytes != reserved {
		t.Fatalf("after Flush: %+v, want 0 entries and only the %d bytes reserved", st, reserved)
	}
}
