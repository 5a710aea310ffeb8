package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/exercises/fakeupstream"
)

// oneAnswerUpstream is a TCP upstream that, on each connection, answers the
// first query it reads and then reads on, answering nothing, until the
// proxy has sent nothing for quiet, and closes: a server shedding load the
// way RFC 7766 lets it. It counts every query it reads.
type oneAnswerUpstream struct {
	ln    net.Listener
	quiet time.Duration
	seen  atomic.Int64
	conns atomic.Int64
	wg    sync.WaitGroup
}

func startOneAnswerUpstream(t *testing.T, quiet time.Duration) *oneAnswerUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &oneAnswerUpstream{ln: ln, quiet: quiet}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.conns.Add(1)
			u.wg.Add(1)
			go u.serve(c)
		}
	}()
	t.Cleanup(func() { ln.Close(); u.wg.Wait() })
	return u
}

func (u *oneAnswerUpstream) serve(c net.Conn) {
	defer u.wg.Done()
	defer c.Close()
	answered := false
	for range 10000 { // bounded: a connection carries far fewer
		c.SetReadDeadline(time.Now().Add(u.quiet))
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return
		}
		frame := make([]byte, binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, frame); err != nil {
			return
		}
		u.seen.Add(1)
		if answered {
			continue
		}
		answered = true
		req := new(dns.Msg)
		if req.Unpack(frame) != nil {
			return
		}
		b, _ := fakeupstream.Answer(req).Pack()
		c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(b))), b...))
	}
}

// The README: every attempt sent to any upstream pays one token of
// DNS_UPSTREAM_RATE_LIMIT, "so the upstreams together never see more than
// the rate". The upstream package sends a query again, on a new
// connection, each time a TCP connection that answered something closes
// under it, and those sends pay nothing. Against an upstream that answers
// one query a connection (a server shedding load), n pipelined queries cost
// it n + (n-1) + ... + 1 queries: 10 queries, 10 tokens, 55 queries seen.
func TestAttackTCPResendsPassTheOutboundLimit(t *testing.T) {
	const n = 10
	up := startOneAnswerUpstream(t, 30*time.Millisecond)
	cfg := testConfig(up.ln.Addr().String())
	cfg.UpstreamTimeout = 2 * time.Second
	cfg.UpstreamRateLimit = RateLimit{Rate: 0.001, Burst: n} // n tokens, and no more for the test's length
	a := startProxy(t, cfg, nil)

	c, err := net.DialTimeout("tcp", a.addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn := &dns.Conn{Conn: c}
	for i := range n {
		m := query(fmt.Sprintf("n%d.example.com", i), dns.TypeA)
		if err := conn.WriteMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	answered := 0
	for range n {
		r, err := conn.ReadMsg()
		if err != nil {
			t.Fatalf("after %d answers: %v", answered, err)
		}
		if r.Rcode == dns.RcodeSuccess {
			answered++
		}
	}
	t.Logf("%d of %d answered; the upstream read %d queries on %d connections", answered, n, up.seen.Load(), up.conns.Load())
	if got := up.seen.Load(); got > n {
		t.Errorf("the upstream read %d queries for %d tokens of the outbound limit: resends on a new connection pay no token", got, n)
	}
}

// A query the upstream layer would have sent again, on its own, but for
// which the outbound limit had no token (upstream.ErrLimited) was never
// answered by the upstream: the proxy's own limit stopped it, as it stops
// a first attempt. Its client must hear that — REFUSED with EDE 0
// "upstream rate limit", counted upstream_limited — not SERVFAIL "no valid
// reply from upstream", counted upstream_error, which blames the upstream
// and trips nothing the operator can find in the outbound limit's figures.
func TestAttackRefusedResendIsAnsweredAsTheOutboundLimit(t *testing.T) {
	const n = 6
	up := startOneAnswerUpstream(t, 30*time.Millisecond)
	cfg := testConfig(up.ln.Addr().String())
	cfg.UpstreamTimeout = 2 * time.Second
	cfg.UpstreamRateLimit = RateLimit{Rate: 0.001, Burst: n} // the first sends, and no re-send
	a := startProxy(t, cfg, nil)

	c, err := net.DialTimeout("tcp", a.addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn := &dns.Conn{Conn: c}
	for i := range n {
		m := query(fmt.Sprintf("n%d.example.com", i), dns.TypeA)
		m.SetEdns0(1232, false) // for the EDE
		if err := conn.WriteMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	answered, limited := 0, 0
	for range n {
		r, err := conn.ReadMsg()
		if err != nil {
			t.Fatalf("after %d answers: %v", answered+limited, err)
		}
		switch e, ok := edeOf(r); {
		case r.Rcode == dns.RcodeSuccess:
			answered++
		case r.Rcode == dns.RcodeRefused && ok && e.InfoCode == dns.ExtendedErrorCodeOther && e.ExtraText == "upstream rate limit":
			limited++
		default:
			t.Errorf("answer %s with EDE %v: want NOERROR, or REFUSED with EDE 0 \"upstream rate limit\"", rcodeName(r), e)
		}
	}
	if answered == 0 || limited == 0 {
		t.Fatalf("%d answered, %d refused by the outbound limit: the test needs both", answered, limited)
	}
	if got := count(a, "A", "upstream_limited", limited); got != limited {
		t.Errorf("upstream_limited = %d, want %d (upstream_error = %d)", got, limited, count(a, "A", "upstream_error", 0))
	}
}
