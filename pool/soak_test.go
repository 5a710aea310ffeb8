package pool

import (
	"testing"

	"github.com/miekg/dns"
)

// maxPooledKept is the largest kept answer an Exchange should carry back
// into the pool: the largest UDP reply the upstream layer reads whole
// (upstream's replyBufSize), as the proxy's answer buffers keep no more than
// 8 KiB (main's maxKeptBuf).
const maxPooledKept = 8192

// A SERVFAIL or REFUSED answer kept in case the retry brings nothing better
// is copied into the Exchange's kept buffer, and the Exchange goes back to
// the pool with it: one large answer over TCP (up to 64 KiB) makes that
// pooled Exchange 64 KiB for as long as traffic keeps it in use. Over a long
// run every Exchange in circulation (up to DNS_MAX_INFLIGHT of them) meets
// one, where the README counts a query waiting for the upstream as a few
// hundred bytes.
func TestSoakPooledExchangeKeepsNoLargeAnswer(t *testing.T) {
	r := newRig(t, rigConfig{n: 2, budget: generous})
	r.ups[1].decide = func([]byte) outcome { return good }
	x, err := r.pool.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	q := new(dns.Msg)
	q.SetQuestion("big.example.", dns.TypeTXT)
	query, _ := q.Pack()
	ch := make(chan result, 2)
	x.Forward(query, "tcp", func(query, reply []byte, err error) {
		ch <- result{append([]byte(nil), query...), append([]byte(nil), reply...), err}
	})
	held := r.ups[0].takeHeld()
	if len(held) != 1 {
		t.Fatalf("%d attempts held at the first upstream, want 1", len(held))
	}
	big := bigServfail(t, held[0].query)
	held[0].done(held[0].query, big, nil) // kept; the retry answers at once
	if res := wait(t, ch); rcode(res) != dns.RcodeSuccess {
		t.Fatalf("rcode %d (%v), want the retry's NOERROR", rcode(res), res.err)
	}
	// x went back to the pool when its report returned, on this goroutine.
	if c := cap(x.kept); c > maxPooledKept {
		t.Fatalf("an Exchange back in the pool holds a %d-byte kept buffer after one %d-byte SERVFAIL; want at most %d", c, len(big), maxPooledKept)
	}
}

// bigServfail is a SERVFAIL to query of about 60 KB, as an upstream may send over TCP.
func bigServfail(t *testing.T, query []byte) []byte {
	t.Helper()
	req := new(dns.Msg)
	if err := req.Unpack(query); err != nil {
		t.Fatal(err)
	}
	m := new(dns.Msg)
	m.SetReply(req)
	m.Rcode = dns.RcodeServerFailure
	for i := range 230 {
		m.Extra = append(m.Extra, &dns.TXT{Hdr: dns.RR_Header{Name: "big.example.", Rrtype: dns.TypeTXT, Class: dns.ClassINET, Ttl: 60},
			Txt: []string{string(rune('a'+i%26)) + string(make([]byte, 250))}})
	}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
