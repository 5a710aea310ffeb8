package main

import (
	"net"
	"testing"

	"github.com/miekg/dns"
)

// The birthday attack: an attacker who is also a client sends many identical
// queries, so that many upstream queries for one name are in flight at once
// and every forged reply has that many chances to hit. A full flight must
// not let the rest go out one by one (it did: 1,000 identical queries put
// 936 upstream queries in flight): at most one upstream query per full
// flight.
func TestBirthdayFloodStaysCoalesced(t *testing.T) {
	fwd := &scripted{hold: true, reply: zone(nil)}
	_, srv := unitProxy(nil, fwd)
	const clients = 1000
	var qs []*dns.Msg
	for i := range clients {
		q := query("www.example.com", dns.TypeA)
		q.Id = uint16(i)
		qs = append(qs, q)
	}
	servedLater(t, srv, qs)
	defer fwd.release()
	// The best a bounded flight can do is one upstream query per full flight.
	limit := (clients + maxFollowers) / (1 + maxFollowers)
	if got := len(fwd.sent()); got > limit {
		t.Fatalf("%d identical queries put %d upstream queries for one name in flight at once (want at most %d): "+
			"each is one more target for a forged reply", clients, got, limit)
	}
}

// The proxy's own OPT strips an EDNS Client Subnet option, so the upstream
// never sees a subnet and the answers cannot depend on it: ECS queries are
// coalesced like any other. Kept apart, they were a switch any client could
// flip to undo coalescing (200 identical ECS queries went out as 200).
func TestECSQueriesAreCoalesced(t *testing.T) {
	fwd := &scripted{hold: true, reply: zone(nil)}
	_, srv := unitProxy(nil, fwd)
	const clients = 200
	var qs []*dns.Msg
	for i := range clients {
		q := ednsQuery("www.example.com", dns.TypeA, 1232, false,
			&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(192, 0, 2, 0).To4()})
		q.Id = uint16(i)
		qs = append(qs, q)
	}
	servedLater(t, srv, qs)
	defer fwd.release()
	sent := fwd.sent()
	withECS := 0
	for _, b := range sent {
		m := new(dns.Msg)
		if m.Unpack(b) != nil {
			continue
		}
		if opt := m.IsEdns0(); opt != nil {
			for _, o := range opt.Option {
				if o.Option() == dns.EDNS0SUBNET {
					withECS++
				}
			}
		}
	}
	if withECS != 0 {
		t.Fatalf("%d upstream queries carried the client's subnet: the proxy's own OPT has no options", withECS)
	}
	if limit := (clients + maxFollowers) / (1 + maxFollowers); len(sent) > limit {
		t.Fatalf("%d identical ECS queries went upstream as %d queries, want at most %d (one per full flight)",
			clients, len(sent), limit)
	}
}
