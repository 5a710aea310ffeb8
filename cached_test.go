package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
)

// tc0 is where the cache tests' manual clocks start.
var tc0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// withCache is cfg with a 1 MiB cache, serve-stale for an hour, and no
// client-response timer (a test that wants one sets it).
func withCache(cfg Config) Config {
	cfg.CacheSize = 1 << 20
	cfg.CacheMaxTTL, cfg.CacheMaxNegativeTTL = 24*time.Hour, time.Hour
	cfg.CacheStale = time.Hour
	return cfg
}

// startCaching starts a fake upstream and a caching proxy in front of it,
// on a manual clock; change(cfg) adjusts the configuration first.
func startCaching(t *testing.T, change func(*Config)) (*app, *fakeupstream.Server, *guard.ManualClock) {
	t.Helper()
	up := startUpstream(t)
	cfg := withCache(testConfig(up.Addr()))
	if change != nil {
		change(&cfg)
	}
	clock := guard.NewManualClock(tc0)
	return startProxy(t, cfg, clock), up, clock
}

// edeCodes returns the Extended DNS Error info codes of m.
func edeCodes(m *dns.Msg) []uint16 {
	var codes []uint16
	if opt := m.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if e, ok := o.(*dns.EDNS0_EDE); ok {
				codes = append(codes, e.InfoCode)
			}
		}
	}
	return codes
}

// ttls returns the TTL of every record but the OPT.
func ttls(m *dns.Msg) []uint32 {
	var out []uint32
	for _, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			if rr.Header().Rrtype != dns.TypeOPT {
				out = append(out, rr.Header().Ttl)
			}
		}
	}
	return out
}

// metric reads one counter or gauge of the proxy's registry by name and
// labels, as the text exposition writes it: `name{l="v"}`.
func metric(t *testing.T, a *app, series string) float64 {
	t.Helper()
	mfs, err := a.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	name, labels, _ := strings.Cut(series, "{")
	labels = strings.TrimSuffix(labels, "}")
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var parts []string
			for _, l := range m.GetLabel() {
				parts = append(parts, l.GetName()+`="`+l.GetValue()+`"`)
			}
			if strings.Join(parts, ",") != labels {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			}
		}
	}
	t.Fatalf("no series %s", series)
	return 0
}

// A hit is the client's own: its ID, its question byte for byte (letter
// case included), its own OPT (size, DO, no upstream options), every TTL
// counted down by the entry's age on the cache's clock; nothing is sent
// upstream, over UDP and TCP alike, and the outcome is cached.
func TestCacheHitIsTheClientsOwn(t *testing.T) {
	a, up, clock := startCaching(t, nil)
	prime := query("www.example.com", dns.TypeA)
	prime.SetEdns0(4096, false)
	primed := ask(t, "udp", a.addr(), prime)
	if primed.Rcode != dns.RcodeSuccess || len(primed.Answer) != 1 || primed.Answer[0].Header().Ttl != 60 {
		t.Fatalf("priming answer %v", primed)
	}
	clock.Advance(20 * time.Second)
	for i, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			q := query("WwW.ExAmPle.CoM", dns.TypeA)
			q.Id = uint16(777 + i)
			q.SetEdns0(2048, false)
			packed, err := q.Pack()
			if err != nil {
				t.Fatal(err)
			}
			before := up.Total()
			r := ask(t, network, a.addr(), q)
			if up.Total() != before {
				t.Fatalf("the upstream received %d queries for a cached name", up.Total()-before)
			}
			if r.Id != q.Id {
				t.Errorf("ID %d, want the client's %d", r.Id, q.Id)
			}
			raw, _ := r.Pack()
			qlen := len(packed) - 12 - 11 // the question: the packet less its header and OPT
			if !bytes.Equal(raw[12:12+qlen], packed[12:12+qlen]) {
				t.Errorf("question bytes %q, want the client's %q", raw[12:12+qlen], packed[12:12+qlen])
			}
			if got := ttls(r); len(got) != 1 || got[0] != 40 {
				t.Errorf("TTLs %v after 20 s of a 60 s entry, want [40]", got)
			}
			opt := r.IsEdns0()
			if opt == nil || opt.UDPSize() != 1232 || opt.Do() || len(opt.Option) != 0 || opt.ExtendedRcode() != 0 {
				t.Errorf("OPT %v, want the proxy's own: size 1232, no DO, no options", opt)
			}
			if r.Authoritative {
				t.Error("AA set on an answer from the cache")
			}
			if r.RecursionAvailable != primed.RecursionAvailable || !r.RecursionDesired {
				t.Errorf("RA %v RD %v, want the upstream's RA (%v) and the client's RD", r.RecursionAvailable, r.RecursionDesired, primed.RecursionAvailable)
			}
		})
	}
	if got := count(a, "A", "cached", 2); got != 2 {
		t.Errorf("cached %d, want 2", got)
	}
	if got := count(a, "A", "forwarded", 1); got != 1 {
		t.Errorf("forwarded %d, want 1", got)
	}
	if n := metric(t, a, "dnsproxi_cache_entries"); n != 1 {
		t.Errorf("cache_entries %v, want 1", n)
	}
}

// A hit touches neither the in-flight cap nor the breaker: with the only
// place at the upstream held and the breaker open, a cached name is still
// answered fresh. It still pays its token at the entry gate.
func TestCacheHitSkipsCapAndBreakerButPaysItsToken(t *testing.T) {
	a, up, clock := startCaching(t, func(c *Config) {
		c.MaxInflight = 1
		c.BreakerThreshold, c.BreakerMinSamples, c.BreakerWindow = 50, 1, 1
		c.BreakerCoolOff = time.Hour
		c.RateLimit = RateLimit{Rate: 1, Burst: 3}
	})
	// After the upstream: the gate's clean-up opens it before the upstream closes.
	gate, open := holdGate(t)
	ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA)) // token 1: stored
	up.SetScript(func(req *dns.Msg, _ string) [][]byte {
		<-gate // holds the one place at the upstream
		return nil
	})
	held := make(chan error, 1)
	go func() {
		_, err := tryAsk("udp", a.addr(), query("held.example.com", dns.TypeA), 3*time.Second) // token 2
		held <- err
	}()
	waitFor(t, "the held query to reach the upstream", func() bool { return up.Total() == 2 })
	if r := ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA)); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 { // token 3
		t.Fatalf("cached name with the cap full: %s %s", rcodeName(r), answerText(r))
	}
	open()
	<-held // the held one fails (no reply): one failure trips a window of one
	waitFor(t, "the breaker to open", func() bool { return a.breaker(0).State() == guard.Open })
	clock.Advance(time.Second) // one token more
	if r := ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA)); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Fatalf("cached name with the breaker open: %s %s", rcodeName(r), answerText(r))
	}
	if _, err := tryAsk("udp", a.addr(), query("www.example.com", dns.TypeA), 300*time.Millisecond); err == nil {
		t.Fatal("a cached name was answered beyond the rate limit: a hit must pay its token")
	}
	if got := count(a, "A", "cached", 2); got != 2 {
		t.Errorf("cached %d, want 2", got)
	}
	if got := count(a, "A", "rate_limited", 1); got != 1 {
		t.Errorf("rate_limited %d, want 1", got)
	}
}

// The query key keeps apart what changes the answer: EDNS or not, DO, CD.
// Each variant is asked upstream once, then answered from the cache.
func TestCacheKeySeparatesEDNSDOCD(t *testing.T) {
	a, up, _ := startCaching(t, nil)
	variants := []struct {
		name string
		make func() *dns.Msg
	}{
		{"plain", func() *dns.Msg { return query("www.example.com", dns.TypeA) }},
		{"EDNS", func() *dns.Msg { q := query("www.example.com", dns.TypeA); q.SetEdns0(1232, false); return q }},
		{"EDNS+DO", func() *dns.Msg { q := query("www.example.com", dns.TypeA); q.SetEdns0(1232, true); return q }},
		{"CD", func() *dns.Msg { q := query("www.example.com", dns.TypeA); q.CheckingDisabled = true; return q }},
	}
	for i, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			for range 2 {
				ask(t, "udp", a.addr(), v.make())
			}
			if got := up.Total(); got != int64(i+1) {
				t.Fatalf("the upstream received %d queries after %d variants asked twice each, want %d", got, i+1, i+1)
			}
		})
	}
	if got := count(a, "A", "cached", len(variants)); got != len(variants) {
		t.Errorf("cached %d, want %d", got, len(variants))
	}
}

// An answer stored from TCP is cut to a UDP client's size like any answer:
// TC with empty sections for a client without EDNS.
func TestCacheHitCutToClientSize(t *testing.T) {
	a, up, _ := startCaching(t, nil)
	if r := ask(t, "tcp", a.addr(), query("big.example.com", dns.TypeTXT)); len(r.Answer) != 20 {
		t.Fatalf("TCP answer with %d records, want 20", len(r.Answer))
	}
	pkt, _ := query("big.example.com", dns.TypeTXT).Pack()
	raw := sendRaw(t, a.addr(), pkt, 3*time.Second)
	r := new(dns.Msg)
	if err := r.Unpack(raw); err != nil {
		t.Fatal(err)
	}
	if len(raw) > 512 || !r.Truncated || len(r.Answer) != 0 {
		t.Errorf("a %d-byte answer, TC %v, %d records: want TC, empty, within 512", len(raw), r.Truncated, len(r.Answer))
	}
	if up.Total() != 1 {
		t.Errorf("the upstream received %d queries, want 1", up.Total())
	}
	if got := count(a, "TXT", "cached", 1); got != 1 {
		t.Errorf("cached %d, want 1", got)
	}
}

// A hit cut to a client's size keeps that client's own OPT, byte for byte:
// the records' TTLs are counted down in the answer only when the records
// are in it, never where the OPT lies once they are cut. The upstream
// compresses, as real ones do, so the first record's TTL field lies 6
// bytes past the question: where a cut answer's OPT has its version,
// flags and length.
func TestCacheHitCutKeepsTheClientsOPT(t *testing.T) {
	compressed := func(req *dns.Msg, _ string) [][]byte {
		m := fakeupstream.Answer(req)
		m.Compress = true
		b, _ := m.Pack()
		return [][]byte{b}
	}
	for _, do := range []bool{false, true} {
		t.Run(fmt.Sprintf("DO=%v", do), func(t *testing.T) {
			a, up, _ := startCaching(t, nil)
			up.SetScript(compressed)
			q := query("big.example.com", dns.TypeTXT)
			q.SetEdns0(4096, do) // the key the hit is asked under: EDNS, and DO or not
			if r := ask(t, "tcp", a.addr(), q); len(r.Answer) != 20 {
				t.Fatalf("TCP answer with %d records, want 20", len(r.Answer))
			}
			q = query("big.example.com", dns.TypeTXT)
			q.SetEdns0(512, do)
			pkt, _ := q.Pack()
			raw := sendRaw(t, a.addr(), pkt, 3*time.Second)
			r := new(dns.Msg)
			if err := r.Unpack(raw); err != nil {
				t.Fatal(err)
			}
			if len(raw) > 512 || !r.Truncated || len(r.Answer) != 0 {
				t.Fatalf("a %d-byte answer, TC %v, %d records: want TC, empty, within 512", len(raw), r.Truncated, len(r.Answer))
			}
			// The OPT ends the answer: root, type, size, then its TTL field
			// (extended RCODE, version, DO and Z) and no options.
			want := []byte{0, 0, 41, 1232 >> 8, 1232 & 0xFF, 0, 0, 0, 0, 0, 0}
			if do {
				want[7] = 0x80
			}
			if len(raw) < len(want) || !bytes.Equal(raw[len(raw)-len(want):], want) {
				t.Errorf("OPT %x, want the proxy's own %x", raw[max(len(raw)-len(want), 0):], want)
			}
			if up.Total() != 1 || count(a, "TXT", "cached", 1) != 1 {
				t.Errorf("the upstream received %d queries, want 1: the cut answer is a hit", up.Total())
			}
		})
	}
}

// What is not stored is asked upstream every time: SERVFAIL, REFUSED, an
// NXDOMAIN without an SOA (RFC 2308 §5), a TTL of 0. (A TC answer never
// reaches the cache: the upstream client asks again over TCP; the cache
// package's own tests refuse one.)
func TestCacheDoesNotStore(t *testing.T) {
	zeroTTL := func(req *dns.Msg, _ string) [][]byte {
		m := fakeupstream.Answer(req)
		for _, rr := range m.Answer {
			rr.Header().Ttl = 0
		}
		b, _ := m.Pack()
		return [][]byte{b}
	}
	tests := []struct {
		name, qname string
		mode        fakeupstream.Mode
		script      func(*dns.Msg, string) [][]byte
	}{
		{"SERVFAIL", "www.example.com", fakeupstream.ServFail, nil},
		{"REFUSED", "www.example.com", fakeupstream.Refused, nil},
		{"NXDOMAIN without SOA", "nx.example.com", fakeupstream.OK, nil},
		{"TTL 0", "www.example.com", fakeupstream.OK, zeroTTL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, up, _ := startCaching(t, nil)
			up.SetMode(tt.mode)
			up.SetScript(tt.script)
			for range 2 {
				ask(t, "udp", a.addr(), query(tt.qname, dns.TypeA))
			}
			if udp, _ := up.Received(); udp != 2 {
				t.Errorf("the upstream received %d UDP queries, want 2: nothing stored", udp)
			}
			if n := metric(t, a, "dnsproxi_cache_entries"); n != 0 {
				t.Errorf("cache_entries %v, want 0", n)
			}
		})
	}
}

// nxWithSOA answers every query NXDOMAIN with an SOA whose TTL is 3600 and
// MINIMUM 900: a negative answer that lives min(3600, 900) = 900 s.
func nxWithSOA(req *dns.Msg, _ string) [][]byte {
	m := new(dns.Msg).SetRcode(req, dns.RcodeNameError)
	m.RecursionAvailable = true
	soa, _ := dns.NewRR("example.com. 3600 IN SOA ns.example.com. host.example.com. 1 7200 900 1209600 900")
	m.Ns = []dns.RR{soa}
	if opt := req.IsEdns0(); opt != nil {
		m.SetEdns0(opt.UDPSize(), false)
	}
	b, _ := m.Pack()
	return [][]byte{b}
}

// A negative answer lives min(SOA TTL, MINIMUM), clamped to
// DNS_CACHE_MAX_NEGATIVE_TTL, and is asked again when that has passed.
func TestCacheNegativeTTLAndClamp(t *testing.T) {
	a, up, clock := startCaching(t, func(c *Config) { c.CacheMaxNegativeTTL = 300 * time.Second })
	up.SetScript(nxWithSOA)
	ask(t, "udp", a.addr(), query("gone.example.com", dns.TypeA))
	clock.Advance(100 * time.Second)
	r := ask(t, "udp", a.addr(), query("gone.example.com", dns.TypeA))
	if r.Rcode != dns.RcodeNameError || len(r.Ns) != 1 || r.Ns[0].Header().Ttl != 200 {
		t.Fatalf("cached NXDOMAIN %s, authority %v: want the SOA at 300-100 = 200 s", rcodeName(r), r.Ns)
	}
	if up.Total() != 1 {
		t.Fatalf("the upstream received %d queries, want 1", up.Total())
	}
	clock.Advance(200 * time.Second) // 300 s: expired; asked again (the refresh succeeds)
	ask(t, "udp", a.addr(), query("gone.example.com", dns.TypeA))
	if up.Total() != 2 {
		t.Errorf("the upstream received %d queries after the clamped TTL, want 2", up.Total())
	}
}

// The metrics of the cache: the outcomes cached and stale start at 0 for
// every query type, and so do the refresh results; the gauges read the cache.
func TestCacheMetricsStartAtZero(t *testing.T) {
	a, _, _ := startCaching(t, nil)
	for _, qtype := range []string{"A", "AAAA", "HTTPS", "OTHER"} {
		for _, o := range []string{"cached", "stale"} {
			if v := testutil.ToFloat64(a.metrics.Queries.WithLabelValues(qtype, o)); v != 0 {
				t.Errorf("%s %s = %v at start", qtype, o, v)
			}
		}
	}
	for _, r := range []string{"updated", "not_stored", "failed", "refused"} {
		if v := metric(t, a, `dnsproxi_cache_refreshes_total{result="`+r+`"}`); v != 0 {
			t.Errorf("refreshes %s = %v at start", r, v)
		}
	}
	ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA))
	if n, b := metric(t, a, "dnsproxi_cache_entries"), metric(t, a, "dnsproxi_cache_bytes"); n != 1 || b <= 0 || b > 1<<20 {
		t.Errorf("entries %v, bytes %v after one answer", n, b)
	}
	metric(t, a, "dnsproxi_cache_evictions_total")
}

// With the cache off, nothing of it is in the way: no entry, every query
// forwarded, the metrics at zero.
func TestCacheOffForwardsEverything(t *testing.T) {
	up := startUpstream(t)
	a := startProxy(t, testConfig(up.Addr()), guard.NewManualClock(tc0))
	for range 3 {
		ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA))
	}
	if up.Total() != 3 || a.proxy.cache != nil {
		t.Errorf("upstream received %d of 3, cache %v", up.Total(), a.proxy.cache)
	}
	if n := metric(t, a, "dnsproxi_cache_entries"); n != 0 {
		t.Errorf("cache_entries %v with the cache off", n)
	}
}

// A query with an EDNS Client Subnet option shares the cache with the same
// query without one, as it shares a flight: the option is never forwarded,
// so the answer cannot depend on the subnet. Its answer carries no ECS.
func TestCacheECSQueriesShareTheEntry(t *testing.T) {
	a, up, _ := startCaching(t, nil)
	askEDNS(t, a, "www.example.com")
	ecs := &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: []byte{198, 51, 100, 0}}
	r := ask(t, "udp", a.addr(), ednsQuery("www.example.com", dns.TypeA, 1232, false, ecs))
	if up.Total() != 1 || len(r.Answer) != 1 {
		t.Fatalf("the upstream received %d queries, answer %s: want the ECS query answered from the cache", up.Total(), answerText(r))
	}
	for _, o := range r.IsEdns0().Option {
		if o.Option() == dns.EDNS0SUBNET {
			t.Errorf("the answer carries an ECS option: %v", o)
		}
	}
	if got := count(a, "A", "cached", 1); got != 1 {
		t.Errorf("cached %d, want 1", got)
	}
}
