//go:build unix

package main

import (
	"bufio"
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// Connections to the metrics address that sent one request and then stay
// open and idle cannot take the process's file descriptors from DNS: under
// ulimit -n 512, 600 of them held, a TCP query is still answered. Before,
// the metrics server kept every idle keep-alive connection for ever and
// accepted without bound, so at the limit accept failed for DNS over TCP
// too ("accept4: too many open files"): TCP was shut to every client for as
// long as the connections were held (seen black-box with 1,490 of them
// under ulimit -n 1500).
func TestIdleMetricsConnectionsCannotShutTCP(t *testing.T) {
	up := startUpstream(t)
	bin := buildBinary(t)
	cmd := exec.Command("sh", "-c", `ulimit -Sn 512 && ulimit -Hn 512 && exec "$0"`, bin)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "DNS_LISTEN=127.0.0.1:0", "DNS_METRICS_ADDR=127.0.0.1:0", "DNS_UPSTREAM=" + up.Addr()}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	addrs := make(chan []string, 1)
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		re := regexp.MustCompile(`msg=listening listen=(\S+) .* metrics=http://(\S+)/metrics`)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addrs <- m[1:]
			}
		}
		cmd.Wait()
	}()
	var dnsAddr, metricsAddr string
	select {
	case a := <-addrs:
		dnsAddr, metricsAddr = a[0], a[1]
	case <-time.After(20 * time.Second):
		t.Fatal("the binary did not start within 20s")
	}

	for i := range 600 {
		c, err := net.DialTimeout("tcp", metricsAddr, time.Second)
		if err != nil {
			t.Fatalf("connection %d to the metrics address: %v", i, err)
		}
		defer c.Close()
		if _, err := fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	// Every TCP query for the next 3 s is answered, while the server
	// accepts what it will of the 600 (at the limit, within milliseconds).
	c := &dns.Client{Net: "tcp", Timeout: time.Second}
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		r, _, err := c.Exchange(query("www.example.com", dns.TypeA), dnsAddr)
		if err != nil || r.Rcode != dns.RcodeSuccess {
			t.Fatalf("with 600 idle metrics connections held, a TCP query: %v; want an answer", err)
		}
	}
}
