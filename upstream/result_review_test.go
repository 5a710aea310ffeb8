package upstream

import (
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// "A reply that arrives after its own query's deadline finds no query to
// answer and stamps nothing: late is not in time, so a uniformly slow
// upstream still fails" (result.go). But a query leaves the table only when
// the sweeper passes, every Timeout/20 (up to 100 ms), and take() never
// looks at the deadline: a reply up to one sweep late is taken as the
// answer, stamps the upstream as answering, and is judged Answer — a
// success for the breaker. An upstream that answers everything a few
// milliseconds after the timeout is judged mostly alive, never failing.
func TestReviewLateReplyIsNotAnAnswer(t *testing.T) {
	const timeout = 200 * time.Millisecond // sweeps every 10 ms
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() { // answers every query 3 ms after its deadline
		buf := make([]byte, 65535)
		for {
			n, from, err := conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			req := new(dns.Msg)
			if req.Unpack(buf[:n]) != nil {
				continue
			}
			b, _ := answer(req).Pack()
			time.AfterFunc(timeout+3*time.Millisecond, func() { conn.WriteToUDP(b, from) })
		}
	}()
	u := newUpstream(t, Config{Addr: conn.LocalAddr().String(), Timeout: timeout})

	type result struct {
		late    time.Duration
		verdict Verdict
		err     error
	}
	late := 0
	var last result
	for i := range 10 {
		ch := make(chan result, 1)
		b, _ := q("late.example.").Pack()
		sent := time.Now()
		u.Forward(b, "udp", func(_, reply []byte, err error) {
			ch <- result{time.Since(sent) - timeout, Judge(reply, err), err}
		})
		select {
		case r := <-ch:
			if r.err == nil && r.late > 0 {
				late++
				last = r
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("query %d not reported", i)
		}
	}
	if late > 0 {
		t.Fatalf("%d of 10 replies that came after their query's deadline were taken as answers (the last %v late, judged %v): "+
			"late is not in time, and a breaker counts these as successes", late, last.late.Round(time.Millisecond), last.verdict)
	}
}
