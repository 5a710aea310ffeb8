package cache

import (
	"errors"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

const soa = "example.com. 600 IN SOA ns.example.com. host.example.com. 1 7200 900 1209600 120"

func TestStoreDecides(t *testing.T) {
	q := query("www.example.com.", dns.TypeA, wire.KeyRD|wire.KeyEDNS)
	a := []string{"www.example.com. 300 IN A 192.0.2.1"}
	ok := func(m *dns.Msg) *dns.Msg { return m }
	tests := []struct {
		name     string
		rcode    int
		an, ns   []string
		edit     func(m *dns.Msg) *dns.Msg
		raw      func(b []byte) []byte
		want     error
		ttl      uint32
		negative bool
	}{
		{"NOERROR with records", dns.RcodeSuccess, a, nil, ok, nil, nil, 300, false},
		{"CNAME chain, NS records", dns.RcodeSuccess,
			[]string{"www.example.com. 900 IN CNAME h.example.net.", "h.example.net. 200 IN A 192.0.2.1"},
			[]string{"example.net. 100 IN NS ns.example.net."}, ok, nil, nil, 100, false},
		{"NODATA with SOA: min(TTL, MINIMUM)", dns.RcodeSuccess, nil, []string{soa}, ok, nil, nil, 120, true},
		{"NXDOMAIN with SOA", dns.RcodeNameError, nil, []string{soa}, ok, nil, nil, 120, true},
		// MINIMUM is how long a negative answer lives (RFC 2308 §4, §5);
		// an SOA beside a positive answer counts its own TTL only.
		{"records with an SOA in authority: MINIMUM is not theirs", dns.RcodeSuccess, a, []string{soa}, ok, nil, nil, 300, false},
		{"SOA TTL below MINIMUM", dns.RcodeNameError, nil,
			[]string{"example.com. 60 IN SOA ns.example.com. host.example.com. 1 7200 900 1209600 3600"}, ok, nil, nil, 60, true},
		{"NXDOMAIN without SOA", dns.RcodeNameError, nil, nil, ok, nil, ErrNoSOA, 0, false},
		{"NODATA without SOA", dns.RcodeSuccess, nil, nil, ok, nil, ErrNoSOA, 0, false},
		{"referral", dns.RcodeSuccess, nil, []string{"example.com. 300 IN NS ns.example.com."}, ok, nil, ErrNoSOA, 0, false},
		{"SOA in the answer is not the negative's", dns.RcodeNameError, []string{soa}, nil, ok, nil, ErrNoSOA, 0, false},
		{"TC", dns.RcodeSuccess, a, nil, func(m *dns.Msg) *dns.Msg { m.Truncated = true; return m }, nil, ErrTruncated, 0, false},
		{"SERVFAIL", dns.RcodeServerFailure, nil, nil, ok, nil, ErrRcode, 0, false},
		{"REFUSED", dns.RcodeRefused, nil, nil, ok, nil, ErrRcode, 0, false},
		{"FORMERR", dns.RcodeFormatError, nil, nil, ok, nil, ErrRcode, 0, false},
		{"BADVERS: extended RCODE, lower bits NOERROR", dns.RcodeSuccess, a, nil, func(m *dns.Msg) *dns.Msg {
			m.SetEdns0(1232, false)
			m.Rcode = dns.RcodeBadVers // 16: packed as 0 in the header, 1 in the OPT
			return m
		}, nil, ErrRcode, 0, false},
		{"TTL 0", dns.RcodeSuccess, []string{"www.example.com. 0 IN A 192.0.2.1"}, nil, ok, nil, ErrZeroTTL, 0, false},
		{"TTL with its top bit set: large, capped at MaxTTL (RFC 8767 §4)", dns.RcodeSuccess, a, nil, ok, func(b []byte) []byte { return setTTL(t, b, 1<<31) }, nil, 86400, false},
		{"SOA MINIMUM 0", dns.RcodeNameError, nil,
			[]string{"example.com. 60 IN SOA ns.example.com. host.example.com. 1 7200 900 1209600 0"}, ok, nil, ErrZeroTTL, 0, false},
		{"OPT TTL field is not a TTL", dns.RcodeSuccess, a, nil, func(m *dns.Msg) *dns.Msg {
			m.SetEdns0(1232, false) // TTL field 0: read as a TTL it would forbid storing
			return m
		}, nil, nil, 300, false},
		{"OPT with DO is not a TTL", dns.RcodeSuccess, []string{"www.example.com. 86400 IN A 192.0.2.1"}, nil, func(m *dns.Msg) *dns.Msg {
			m.SetEdns0(1232, true) // TTL field 32768
			return m
		}, nil, nil, 86400, false},
		{"client subnet in the reply", dns.RcodeSuccess, a, nil, func(m *dns.Msg) *dns.Msg {
			m.SetEdns0(1232, false)
			m.IsEdns0().Option = []dns.EDNS0{&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: []byte{192, 0, 2, 0}}}
			return m
		}, nil, ErrUncacheable, 0, false},
		{"not a response", dns.RcodeSuccess, a, nil, func(m *dns.Msg) *dns.Msg { m.Response = false; return m }, nil, ErrMalformed, 0, false},
		{"opcode NOTIFY", dns.RcodeSuccess, a, nil, func(m *dns.Msg) *dns.Msg { m.Opcode = dns.OpcodeNotify; return m }, nil, ErrMalformed, 0, false},
		{"another question", dns.RcodeSuccess, a, nil, func(m *dns.Msg) *dns.Msg { m.Question[0].Name = "ww.example.com."; return m }, nil, ErrQuestion, 0, false},
		{"another type", dns.RcodeSuccess, a, nil, func(m *dns.Msg) *dns.Msg { m.Question[0].Qtype = dns.TypeAAAA; return m }, nil, ErrQuestion, 0, false},
		{"record cut short", dns.RcodeSuccess, a, nil, ok, func(b []byte) []byte { return b[:len(b)-1] }, ErrMalformed, 0, false},
		// A transaction signature signs the upstream's hop and must come
		// last (RFC 8945 §5.1): one before the OPT was kept as an ordinary
		// additional record and served to every client from the cache.
		{"TSIG before the OPT", dns.RcodeSuccess, a, nil, func(m *dns.Msg) *dns.Msg {
			m.Extra = append(m.Extra, &dns.TSIG{Hdr: dns.RR_Header{Name: "key.", Rrtype: dns.TypeTSIG, Class: dns.ClassANY},
				Algorithm: dns.HmacSHA256, Fudge: 300, MACSize: 2, MAC: "abcd", OrigId: m.Id})
			m.SetEdns0(1232, false)
			return m
		}, nil, ErrMalformed, 0, false},
		{"SOA too short for its numbers", dns.RcodeNameError, nil, nil, ok, func(b []byte) []byte {
			wire.SetCounts(b, 1, 0, 1, 0)
			// owner: the question's name; SOA IN, TTL 600, two bytes of data
			return append(b, 0xC0, 12, 0, 6, 0, 1, 0, 0, 2, 88, 0, 2, 0, 0)
		}, ErrMalformed, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := pack(t, tt.edit(answer(t, q, tt.rcode, tt.an, tt.ns, nil)))
			if tt.raw != nil {
				b = tt.raw(b)
			}
			c := newCache(t, Config{StaleWindow: time.Hour})
			k := keyOf(t, q)
			err := c.Store(k, b, t0)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Store: %v, want %v", err, tt.want)
			}
			h, st := c.Lookup(k, t0)
			if tt.want != nil {
				if st != Miss {
					t.Fatalf("not stored, yet Lookup found %v", st)
				}
				return
			}
			if st != Fresh || h.TTL() != tt.ttl || h.Negative() != tt.negative {
				t.Fatalf("Lookup: %v, TTL %d, negative %v; want fresh, %d, %v", st, h.TTL(), h.Negative(), tt.ttl, tt.negative)
			}
		})
	}
}

func TestZoneTransfersAreNotStored(t *testing.T) {
	for _, qt := range []uint16{dns.TypeAXFR, dns.TypeIXFR} {
		q := query("example.com.", qt, 0)
		b := pack(t, answer(t, q, dns.RcodeSuccess, []string{soa, "example.com. 600 IN NS ns.example.com.", soa}, nil, nil))
		if err := newCache(t, Config{}).Store(keyOf(t, q), b, t0); !errors.Is(err, ErrUncacheable) {
			t.Fatalf("%s: Store: %v, want ErrUncacheable", dns.TypeToString[qt], err)
		}
	}
}

func TestTTLClamps(t *testing.T) {
	q := query("www.example.com.", dns.TypeA, wire.KeyRD)
	tests := []struct {
		name   string
		cfg    Config
		rcode  int
		an, ns []string
		ttl    uint32
	}{
		{"default max 1 day", Config{}, dns.RcodeSuccess, []string{"www.example.com. 604800 IN A 192.0.2.1"}, nil, 86400},
		{"MaxTTL", Config{MaxTTL: time.Hour}, dns.RcodeSuccess, []string{"www.example.com. 7200 IN A 192.0.2.1"}, nil, 3600},
		{"MinTTL raises", Config{MinTTL: time.Minute}, dns.RcodeSuccess, []string{"www.example.com. 5 IN A 192.0.2.1"}, nil, 60},
		{"MaxTTL does not bound a negative", Config{MaxTTL: time.Minute}, dns.RcodeNameError, nil,
			[]string{"example.com. 600 IN SOA ns.example.com. host.example.com. 1 7200 900 1209600 300"}, 300},
		{"default max negative 1 h", Config{}, dns.RcodeNameError, nil,
			[]string{"example.com. 86400 IN SOA ns.example.com. host.example.com. 1 7200 900 1209600 86400"}, 3600},
		{"MaxNegativeTTL", Config{MaxNegativeTTL: time.Minute}, dns.RcodeSuccess, nil, []string{soa}, 60},
		{"MinTTL raises a negative", Config{MinTTL: 10 * time.Minute}, dns.RcodeNameError, nil, []string{soa}, 600},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCache(t, tt.cfg)
			k := keyOf(t, q)
			if err := c.Store(k, pack(t, answer(t, q, tt.rcode, tt.an, tt.ns, nil)), t0); err != nil {
				t.Fatal(err)
			}
			h, st := c.Lookup(k, t0)
			if st != Fresh || h.TTL() != tt.ttl {
				t.Fatalf("%v with TTL %d, want fresh with %d", st, h.TTL(), tt.ttl)
			}
			if h, st := c.Lookup(k, at(time.Duration(tt.ttl)*time.Second)); st != Miss {
				t.Fatalf("at its TTL: %v with TTL %d, want a miss", st, h.TTL())
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []Config{
		{Size: MinSize - 1},
		{Size: MinSize, MinTTL: -time.Second},
		{Size: MinSize, MaxTTL: time.Millisecond},
		{Size: MinSize, MaxNegativeTTL: 1 << 62},
		{Size: MinSize, MinTTL: 2 * time.Hour},
		{Size: MinSize, StaleWindow: -time.Second},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("New(%+v): %v, want ErrConfig", cfg, err)
		}
	}
	if _, err := New(Config{Size: MinSize}); err != nil {
		t.Fatal(err)
	}
}
