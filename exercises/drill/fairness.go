package main

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// The fairness drill's figures. The flooder sends 20× the per-client rate;
// the polite clients together send half the global rate, so without the
// flooder the global bucket would pass them all.
const (
	fairClientRate = 50                  // DNS_CLIENT_RATE_LIMIT, per second
	fairFloodRate  = 20 * fairClientRate // the flooder, from 127.0.0.2
	fairGlobalRate = 200                 // DNS_RATE_LIMIT in run 1
	fairPolite     = 20                  // polite clients, 127.0.1.1 up
	fairPoliteRate = 5                   // queries per second each
	fairSlip       = 2                   // slip:N in run 3
)

// fairRun is one run's configuration and what it measured.
type fairRun struct {
	name string
	env  map[string]string

	politeSent, politeOK        int
	floodSent, floodOK, floodTC int // UDP answers to the flooder: NOERROR, and empty TC
	tcpRetries, tcpOK           int // the flooder's TCP retries after TC, and those answered NOERROR
	clientLimited, rateLimited  int
	tableEntries                int
}

// drillFairness: one flooder and twenty polite clients, three runs of the
// proxy: the global bucket alone, the per-client bucket, the per-client
// bucket with slip. One table.
func drillFairness(r *rig) error {
	span := r.dur(10 * time.Second)
	runs := []*fairRun{
		{name: "global only", env: map[string]string{"DNS_RATE_LIMIT": fmt.Sprintf("%d,20", fairGlobalRate)}},
		{name: "per-client", env: map[string]string{"DNS_CLIENT_RATE_LIMIT": fmt.Sprintf("%d,10", fairClientRate)}},
		{name: fmt.Sprintf("per-client, slip:%d", fairSlip), env: map[string]string{
			"DNS_CLIENT_RATE_LIMIT": fmt.Sprintf("%d,10", fairClientRate), "DNS_LIMIT_ACTION": fmt.Sprintf("slip:%d", fairSlip)}},
	}
	r.printf("fairness: one client floods at %d queries/s from 127.0.0.2 (20× the per-client rate) while %d polite\n",
		fairFloodRate, fairPolite)
	r.printf("  clients, 127.0.1.1 to 127.0.1.%d, send %d queries/s each, for %s per run; the flooder retries over TCP\n",
		fairPolite, fairPoliteRate, secs(span))
	r.printf("  when an answer has TC, as a real client does.\n\n")
	for _, run := range runs {
		if err := r.startProxy(run.env); err != nil {
			return err
		}
		var wg sync.WaitGroup
		var floodErr error
		wg.Go(func() { floodErr = fairFlood(r.proxy.Addr, span, run) })
		wg.Go(func() { fairPoliteLoad(r.proxy.Addr, span, run) })
		wg.Wait()
		s := r.scrape()
		run.clientLimited, run.rateLimited = s.Outcome("client_limited"), s.Outcome("rate_limited")
		run.tableEntries = int(s.Get("dnsproxi_client_table_entries"))
		r.stopProxy()
		if floodErr != nil {
			return floodErr
		}
	}

	r.printf("  %-22s %14s %18s %14s %16s %15s\n", "run", "polite answered", "flooder answered", "flooder TC", "TCP retries ok", "client_limited")
	for _, x := range runs {
		r.printf("  %-22s %8d/%-6d %11d/%-6d %14d %10d/%-5d %15d\n", x.name, x.politeOK, x.politeSent,
			x.floodOK, x.floodSent, x.floodTC, x.tcpOK, x.tcpRetries, x.clientLimited)
	}
	global, fair, slip := runs[0], runs[1], runs[2]
	quota := float64(fairClientRate)*span.Seconds() + 10
	r.printf("\n  The flooder's quota per run: %d/s × %s + a burst of 10 = %.0f answers.\n", fairClientRate, secs(span), quota)
	r.printf("  Notice: the global bucket cannot tell the flooder from the others, so every client gets the same\n")
	r.printf("  small share; the per-client bucket spends the flooder's excess on the flooder alone. With slip,\n")
	r.printf("  every %dnd refused query gets an empty TC answer: the flooder retries over TCP, where it has a\n", fairSlip)
	r.printf("  share of its own (the per-client gate keeps a table per transport) and no more, so its excess\n")
	r.printf("  never reaches the shared bucket; a flood with a forged source gets at most 1/%d of its refused\n", fairSlip)
	r.printf("  queries answered, each no bigger.\n")

	pct := func(a, b int) float64 { return 100 * float64(a) / float64(max(b, 1)) }
	r.expect(pct(global.politeOK, global.politeSent) < 50, "global only: polite clients got %.0f%% answered, want them starved (< 50%%)",
		pct(global.politeOK, global.politeSent))
	for _, x := range []*fairRun{fair, slip} {
		r.expect(pct(x.politeOK, x.politeSent) >= 99, "%s: polite clients got %.1f%% answered, want ≥ 99%%", x.name, pct(x.politeOK, x.politeSent))
		r.expect(float64(x.floodOK) <= quota+1 && float64(x.floodOK) >= 0.8*float64(fairClientRate)*span.Seconds(),
			"%s: the flooder got %d UDP answers, want its rate (≤ %.0f)", x.name, x.floodOK, quota)
	}
	refused := slip.floodSent - slip.floodOK
	r.expect(slip.floodTC <= refused/fairSlip+1, "slip: %d TC answers to %d refused queries, want ≤ 1/%d", slip.floodTC, refused, fairSlip)
	r.expect(slip.floodTC > 0 && float64(slip.tcpOK) <= quota+1 && slip.tcpOK >= min(slip.tcpRetries, int(0.8*float64(fairClientRate)*span.Seconds())),
		"slip: %d of %d TCP retries answered, want the flooder's TCP share (≤ %.0f)", slip.tcpOK, slip.tcpRetries, quota)
	r.expect(fair.floodTC == 0 && fair.tcpRetries == 0, "per-client (drop): %d TC answers", fair.floodTC)
	r.numbers = map[string]int{
		"global_polite_pct": int(pct(global.politeOK, global.politeSent)),
		"fair_polite_pct":   int(pct(fair.politeOK, fair.politeSent)),
		"slip_polite_pct":   int(pct(slip.politeOK, slip.politeSent)),
		"fair_flood_ok":     fair.floodOK, "quota": int(quota), "tcp_floor": min(slip.tcpRetries, int(0.8*float64(fairClientRate)*span.Seconds())),
		"slip_tc": slip.floodTC, "slip_refused": refused, "slip_tcp_ok": slip.tcpOK, "slip_tcp_retries": slip.tcpRetries,
	}
	return nil
}

// fairPoliteLoad runs the polite clients: each from its own address, at
// fairPoliteRate queries a second, one try each with a 1 s timeout.
func fairPoliteLoad(addr string, span time.Duration, run *fairRun) {
	var sent, ok atomic.Int64
	var wg sync.WaitGroup
	gap := time.Second / fairPoliteRate
	n := int(span / gap)
	for c := range fairPolite {
		src := &net.UDPAddr{IP: net.IPv4(127, 0, 1, byte(c+1))}
		client := &dns.Client{Net: "udp", Timeout: time.Second, Dialer: &net.Dialer{LocalAddr: src, Timeout: time.Second}}
		start := time.Now().Add(gap * time.Duration(c) / fairPolite) // spread over the first gap
		wg.Go(func() {
			var inner sync.WaitGroup
			for i := range n {
				time.Sleep(time.Until(start.Add(gap * time.Duration(i))))
				inner.Go(func() {
					q := new(dns.Msg)
					q.SetQuestion(fmt.Sprintf("p%d-%d.example.com.", c, i), dns.TypeA)
					sent.Add(1)
					if r, _, err := client.Exchange(q, addr); err == nil && r.Rcode == dns.RcodeSuccess && !r.Truncated {
						ok.Add(1)
					}
				})
			}
			inner.Wait()
		})
	}
	wg.Wait()
	run.politeSent, run.politeOK = int(sent.Load()), int(ok.Load())
}

// fairFlood sends fairFloodRate queries a second from 127.0.0.2 for span,
// counts the UDP answers, and retries over one TCP connection from the
// same address every query answered with TC.
func fairFlood(addr string, span time.Duration, run *fairRun) error {
	to, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return err
	}
	src := net.IPv4(127, 0, 0, 2)
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: src})
	if err != nil {
		return err
	}
	defer udp.Close()
	udp.SetReadBuffer(4 << 20)
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: src}, Timeout: 2 * time.Second}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer nc.Close()
	tcp := &dns.Conn{Conn: nc}

	var tcpRetries, tcpOK atomic.Int64
	var readers sync.WaitGroup
	readers.Go(func() { // TCP answers
		for {
			r, err := tcp.ReadMsg()
			if err != nil {
				return
			}
			if r.Rcode == dns.RcodeSuccess {
				tcpOK.Add(1)
			}
		}
	})
	var floodOK, floodTC int
	readers.Go(func() { // UDP answers; a TC one is retried over TCP
		buf := make([]byte, 65535)
		for {
			n, err := udp.Read(buf)
			if err != nil {
				return
			}
			r := new(dns.Msg)
			if r.Unpack(buf[:n]) != nil {
				continue
			}
			switch {
			case r.Truncated:
				floodTC++
				q := new(dns.Msg)
				q.SetQuestion(r.Question[0].Name, dns.TypeA)
				q.Id = r.Id
				tcpRetries.Add(1)
				tcp.WriteMsg(q)
			case r.Rcode == dns.RcodeSuccess:
				floodOK++
			}
		}
	})

	const tick = time.Millisecond // one query at a time, as a steady flood arrives
	perTick := fairFloodRate * int(tick) / int(time.Second)
	start := time.Now()
	sent := 0
	b := make([]byte, 0, 64)
	for i := 0; time.Since(start) < span; i++ {
		// As many as the rate owes by now: a flooder held up by a loaded
		// machine catches up instead of flooding less than the drill says.
		due := max(int(time.Since(start)*fairFloodRate/time.Second), sent+perTick)
		for sent < due {
			q := new(dns.Msg)
			q.SetQuestion(fmt.Sprintf("f%d.example.com.", sent), dns.TypeA)
			q.Id = uint16(sent)
			b, _ = q.PackBuffer(b)
			udp.WriteToUDP(b, to)
			sent++
		}
		time.Sleep(time.Until(start.Add(tick * time.Duration(i+1))))
	}
	// The last answers and TCP retries: bounded waits, then the sockets close.
	udp.SetReadDeadline(time.Now().Add(time.Second))
	nc.SetReadDeadline(time.Now().Add(2 * time.Second))
	readers.Wait()
	run.floodSent, run.floodOK, run.floodTC = sent, floodOK, floodTC
	run.tcpRetries, run.tcpOK = int(tcpRetries.Load()), int(tcpOK.Load())
	return nil
}
