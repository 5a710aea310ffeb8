package main

import (
	"testing"
	"time"

	"github.com/miekg/dns"
)

// noDataAfterCNAME answers with the chain alone: the name is an alias, and
// its target has no record of the type asked (RFC 2308 §2.2: NODATA, "it
// may also contain a CNAME chain"), with the target zone's SOA, a day each.
func noDataAfterCNAME(req *dns.Msg, _ string) [][]byte {
	m := new(dns.Msg).SetReply(req)
	m.RecursionAvailable = true
	cname, _ := dns.NewRR(req.Question[0].Name + " 86400 IN CNAME h.example.net.")
	soa, _ := dns.NewRR("example.net. 86400 IN SOA ns.example.net. host.example.net. 1 7200 900 1209600 86400")
	m.Answer, m.Ns = []dns.RR{cname}, []dns.RR{soa}
	b, _ := m.Pack()
	return [][]byte{b}
}

// DNS_CACHE_MAX_NEGATIVE_TTL bounds how long a NODATA is answered from the
// cache, a NODATA after a CNAME as much as one without: past it the
// upstream is asked again.
func TestTimeNoDataAfterCNAMEHonoursMaxNegativeTTL(t *testing.T) {
	a, up, clock := startCaching(t, func(c *Config) { c.CacheMaxNegativeTTL = 300 * time.Second })
	up.SetScript(noDataAfterCNAME)
	ask(t, "udp", a.addr(), query("www.example.com", dns.TypeAAAA))
	clock.Advance(300 * time.Second)
	r := ask(t, "udp", a.addr(), query("www.example.com", dns.TypeAAAA))
	if up.Total() != 2 {
		t.Fatalf("DNS_CACHE_MAX_NEGATIVE_TTL=300s, 300 s later: the upstream received %d queries, want 2; the client got TTLs %v from the cache",
			up.Total(), ttls(r))
	}
}
