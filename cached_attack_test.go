package main

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/dnsserver"
)

// bigTXT answers req with TXT records of about want bytes in all, over
// any network and whatever size the query advertised, as an authority for
// a zone of large records answers over TCP.
func bigTXT(req *dns.Msg, want int) []byte {
	m := new(dns.Msg)
	m.SetReply(req)
	q := req.Question[0]
	for i := 0; m.Len() < want; i++ {
		m.Answer = append(m.Answer, &dns.TXT{
			Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 3600},
			Txt: []string{fmt.Sprintf("%04d %s", i, strings.Repeat("x", 240))},
		})
	}
	if opt := req.IsEdns0(); opt != nil {
		m.SetEdns0(opt.UDPSize(), false)
	}
	b, _ := m.Pack()
	return b
}

// A UDP hit on a large cached answer (one a TCP client brought in) costs
// what a hit on a small one costs: the client is sent TC, so copying the
// records only to throw them away, in a buffer allocated for them, would
// let any client that primed such a name over TCP make each of its UDP
// queries cost a 60 KB allocation and copy, a hundred times a plain hit.
func TestUDPHitOnALargeCachedAnswerCostsAsMuchAsASmallOne(t *testing.T) {
	a, up, _ := startCaching(t, nil)
	up.SetScript(func(req *dns.Msg, network string) [][]byte {
		if req.Question[0].Name == "big.example.com." {
			return [][]byte{bigTXT(req, 60000)}
		}
		r := new(dns.Msg).SetReply(req)
		r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: req.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 3600}, A: net.IPv4(192, 0, 2, 1)})
		if opt := req.IsEdns0(); opt != nil {
			r.SetEdns0(opt.UDPSize(), false)
		}
		b, _ := r.Pack()
		return [][]byte{b}
	})
	msg := func(name string, qtype uint16) *dns.Msg {
		q := query(name, qtype)
		q.SetEdns0(1232, false)
		return q
	}
	// Prime both names over TCP: the big one is stored whole.
	if r := ask(t, "tcp", a.addr(), msg("big.example.com", dns.TypeTXT)); len(r.Answer) < 200 || r.Truncated {
		t.Fatalf("priming over TCP: %d records, TC %v", len(r.Answer), r.Truncated)
	}
	if r := ask(t, "tcp", a.addr(), msg("small.example.com", dns.TypeA)); len(r.Answer) != 1 {
		t.Fatalf("priming the small name: %s", answerText(r))
	}
	sent := up.Total()

	client := netip.MustParseAddrPort("127.0.0.1:5353")
	srv := &dnsserver.Server{Handler: dnsserver.HandlerFunc(func(w dnsserver.ResponseWriter, q *dnsserver.Query) {
		q.Client = client
		a.proxy.handleQuery(w, q)
	})}
	perHit := func(name string, qtype uint16) uint64 {
		pkt, err := msg(name, qtype).Pack()
		if err != nil {
			t.Fatal(err)
		}
		w := &recorder{}
		srv.ServePacket(w, append([]byte(nil), pkt...))
		if len(w.out) != 1 {
			t.Fatalf("%s: %d answers to a hit", name, len(w.out))
		}
		r := new(dns.Msg)
		if err := r.Unpack(w.out[0]); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if name == "big.example.com" && (!r.Truncated || len(r.Answer) != 0) {
			t.Fatalf("the big name over UDP: TC %v, %d records; want TC and none", r.Truncated, len(r.Answer))
		}
		const n = 200
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range n {
			srv.ServePacket(discardWriter{}, append([]byte(nil), pkt...))
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / n
	}
	small := perHit("small.example.com", dns.TypeA)
	big := perHit("big.example.com", dns.TypeTXT)
	if got := up.Total(); got != sent {
		t.Fatalf("the hits sent %d queries upstream", got-sent)
	}
	t.Logf("bytes allocated per UDP hit: small answer %d, 60 KB answer %d", small, big)
	if big > small+1024 {
		t.Errorf("a UDP hit on a 60 KB cached answer allocates %d bytes, a hit on a small one %d: the records are copied into a fresh buffer and thrown away for TC", big, small)
	}
}

// refreshesEnded is how many refreshes have ended, whatever their result.
func refreshesEnded(t *testing.T, a *app) float64 {
	var n float64
	for _, r := range []string{"updated", "not_stored", "failed", "refused"} {
		n += metric(t, a, `dnsproxi_cache_refreshes_total{result="`+r+`"}`)
	}
	return n
}

// A prefetch refreshes the entry whatever network the hit that set it off
// came on. An answer too large for UDP (DNSSEC answers often are) was stored
// from a TCP query; its clients ask over UDP first, get TC from the cache,
// and ask again over TCP. The UDP hit in the last tenth is the one that
// prefetches: sent over UDP, the refresh comes back TC, which is not stored,
// and the entry, its one prefetch spent, expires as if prefetch were off.
func TestPrefetchOfALargeAnswerSetOffOverUDPRefreshesIt(t *testing.T) {
	a, up, clock := startCaching(t, func(c *Config) { c.CachePrefetch = true })
	big := func() *dns.Msg {
		q := query("big.example.com", dns.TypeTXT)
		q.SetEdns0(1232, false)
		return q
	}
	if r := ask(t, "tcp", a.addr(), big()); r.Truncated || len(r.Answer) != 20 {
		t.Fatalf("priming over TCP: TC %v, %d records", r.Truncated, len(r.Answer))
	}
	clock.Advance(55 * time.Second) // TTL 60: in its last tenth
	if r := ask(t, "udp", a.addr(), big()); !r.Truncated {
		t.Fatalf("over UDP at 55 s: TC %v, %d records; want TC from the cache", r.Truncated, len(r.Answer))
	}
	waitFor(t, "the prefetch to end", func() bool { return refreshesEnded(t, a) >= 1 })
	if got := metric(t, a, `dnsproxi_cache_refreshes_total{result="updated"}`); got != 1 {
		t.Errorf("prefetch: updated %v, not_stored %v; want the entry updated", got,
			metric(t, a, `dnsproxi_cache_refreshes_total{result="not_stored"}`))
	}
	clock.Advance(10 * time.Second) // past the first entry's expiry
	sent := up.Total()
	if r := ask(t, "tcp", a.addr(), big()); r.Truncated || len(r.Answer) != 20 {
		t.Fatalf("over TCP at 65 s: TC %v, %d records", r.Truncated, len(r.Answer))
	}
	if got := up.Total() - sent; got != 0 {
		t.Errorf("at 65 s the TCP client's query went upstream (%d queries): the prefetched entry should answer it", got)
	}
}

// The same for an expired entry's refresh: a UDP client's query for an
// answer too large for UDP refreshes the entry over TCP, so the answer is
// stored again (the client itself gets TC, as it would from the upstream)
// and its retry over TCP is answered from the cache. Over UDP the refresh
// came back TC, was not stored, and the retry went upstream again.
func TestRefreshOfALargeAnswerSetOffOverUDPStoresIt(t *testing.T) {
	a, up, clock := startCaching(t, nil)
	big := func() *dns.Msg {
		q := query("big.example.com", dns.TypeTXT)
		q.SetEdns0(1232, false)
		return q
	}
	if r := ask(t, "tcp", a.addr(), big()); r.Truncated || len(r.Answer) != 20 {
		t.Fatalf("priming over TCP: TC %v, %d records", r.Truncated, len(r.Answer))
	}
	clock.Advance(61 * time.Second) // TTL 60: expired
	if r := ask(t, "udp", a.addr(), big()); !r.Truncated || len(r.Answer) != 0 {
		t.Fatalf("over UDP at 61 s: TC %v, %d records; want TC", r.Truncated, len(r.Answer))
	}
	if got := metric(t, a, `dnsproxi_cache_refreshes_total{result="updated"}`); got != 1 {
		t.Errorf("refresh: updated %v, not_stored %v; want the entry updated", got,
			metric(t, a, `dnsproxi_cache_refreshes_total{result="not_stored"}`))
	}
	sent := up.Total()
	if r := ask(t, "tcp", a.addr(), big()); r.Truncated || len(r.Answer) != 20 {
		t.Fatalf("the retry over TCP: TC %v, %d records", r.Truncated, len(r.Answer))
	}
	if got := up.Total() - sent; got != 0 {
		t.Errorf("the retry over TCP went upstream (%d queries): the refreshed entry should answer it", got)
	}
}
