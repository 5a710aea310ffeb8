package main

// Attacks on the whole proxy with every feature on (access list, per-client
// and global buckets, breaker, cache with serve-stale and prefetch,
// coalescing, in-flight cap, query log), by floods from many 127.x sources,
// while a polite client at 127.0.0.2 asks a name the cache holds.

import (
	"encoding/binary"
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
)

// floodConfig is cfg for up with every feature on, as an operator would
// run it: the default in-flight cap, per-client and global buckets, the
// breaker, a cache with serve-stale and prefetch, and a query log.
func floodConfig(t *testing.T, up string) Config {
	cfg := withCache(testConfig(up))
	cfg.UpstreamTimeout = time.Second
	cfg.CacheStaleWait = 400 * time.Millisecond
	cfg.CachePrefetch = true
	cfg.MaxInflight = 1000
	cfg.ClientRateLimit = RateLimit{Rate: 200, Burst: 200}
	cfg.ClientTableSize = 100000
	cfg.ClientPrefix = ClientPrefix{V4: 32, V6: 64}
	cfg.RateLimit = RateLimit{Rate: 100000, Burst: 100000}
	cfg.BreakerThreshold = 50
	cfg.BreakerCoolOff = 2 * time.Second
	cfg.QueryLog = QueryLogTarget(filepath.Join(t.TempDir(), "query.log"))
	cfg.QueryLogSample = 1
	cfg.TCPMaxConns = 200
	return cfg
}

// politeClient asks name from 127.0.0.2 every 10 ms until stop, without
// waiting for answers, and counts what came back: answered within 100 ms,
// later, or not at all (500 ms after the last query).
type politeClient struct {
	mu       sync.Mutex
	sentAt   map[uint16]time.Time
	sent     int
	answered int
	late     int // answered after 100 ms
	done     chan struct{}
}

func startPolite(t *testing.T, addr, name string, stop <-chan struct{}) *politeClient {
	t.Helper()
	c := udpFrom(t, "127.0.0.2")
	to, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	pc := &politeClient{sentAt: map[uint16]time.Time{}, done: make(chan struct{})}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		buf := make([]byte, 1500)
		for {
			n, _, err := c.ReadFromUDP(buf)
			if err != nil {
				return // the deadline below
			}
			r := new(dns.Msg)
			if r.Unpack(buf[:n]) != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
				continue
			}
			pc.mu.Lock()
			if at, ok := pc.sentAt[r.Id]; ok {
				delete(pc.sentAt, r.Id)
				pc.answered++
				if time.Since(at) > 100*time.Millisecond {
					pc.late++
				}
			}
			pc.mu.Unlock()
		}
	}()
	go func() {
		defer close(pc.done)
		limit := time.After(10 * time.Second)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
	loop:
		for id := uint16(1); ; id++ {
			select {
			case <-stop:
				break loop
			case <-limit:
				break loop
			case <-tick.C:
			}
			m := ednsQuery(name, dns.TypeA, 1232, false)
			m.Id = id
			b, _ := m.Pack()
			pc.mu.Lock()
			pc.sentAt[id] = time.Now()
			pc.sent++
			pc.mu.Unlock()
			if _, err := c.WriteToUDP(b, to); err != nil {
				break
			}
		}
		c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		<-readerDone
	}()
	return pc
}

// lost is how many of the polite client's queries went unanswered.
func (pc *politeClient) lost() int {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.sent - pc.answered
}

func (pc *politeClient) String() string {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return fmt.Sprintf("%d asked, %d answered (%d after 100 ms)", pc.sent, pc.answered, pc.late)
}

// floodSources sends each of names n times in all, spread over sources
// 127.1.x.y (each source within its per-client burst), as fast as it can.
// It returns once every packet is sent.
func floodSources(t *testing.T, addr string, names []string, copies, sources int) int {
	t.Helper()
	to, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]*net.UDPConn, sources)
	for i := range conns {
		conns[i] = udpFrom(t, fmt.Sprintf("127.1.%d.%d", i/250, i%250+1))
	}
	var wg sync.WaitGroup
	var sent atomic.Int64
	for s, c := range conns {
		wg.Go(func() {
			id := uint16(0)
			for k := range copies {
				for j, name := range names {
					if (k*len(names)+j)%sources != s {
						continue
					}
					m := ednsQuery(name, dns.TypeA, 1232, false)
					id++
					m.Id = id
					b, _ := m.Pack()
					if _, err := c.WriteToUDP(b, to); err == nil {
						sent.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	return int(sent.Load())
}

// A flash crowd for names whose authority is slow: every client asks the
// same few slow names at once, each client well within its own bucket.
// Each name goes upstream once per 65 askers (coalescing), far within the
// in-flight cap, and its askers wait as followers. The polite client asks a
// name the cache holds, fresh: nothing of the crowd's should stand between
// it and its cached answer.
func TestAttackSlowNameCrowdSilencesCachedAnswers(t *testing.T) {
	tests := []struct {
		name          string
		names, askers int // the crowd: askers of each of names
		sources       int
	}{
		// 60 queries upstream (60 of 1,000 places under the cap), 3,540 followers
		{"60 slow names, 60 askers each", 60, 60, 200},
		// 48 queries upstream, 3,052 followers: one name everyone asks
		{"one slow name, 3,100 askers", 1, 3100, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := startUpstream(t)
			up.SetDelay(5 * time.Second) // "slow" names: past the proxy's 1 s timeout
			cfg := floodConfig(t, up.Addr())
			a := startProxy(t, cfg, guard.RealClock{})
			if r := askFrom(t, "udp", "127.0.0.2", a.addr(), ednsQuery("polite.example.com", dns.TypeA, 1232, false), 2*time.Second); r == nil || len(r.Answer) == 0 {
				t.Fatalf("priming the cache: %v", r)
			}
			stop := make(chan struct{})
			pc := startPolite(t, a.addr(), "polite.example.com", stop)
			time.Sleep(100 * time.Millisecond) // a baseline of polite queries before the crowd
			var names []string
			for i := range tt.names {
				names = append(names, fmt.Sprintf("slow.n%d.example.com", i))
			}
			sent := floodSources(t, a.addr(), names, tt.askers, tt.sources)
			time.Sleep(700 * time.Millisecond) // the crowd waits on the upstream for 1 s
			close(stop)
			<-pc.done
			t.Logf("crowd: %d sent; polite client: %s; server dropped overloaded: %v; coalesced %v",
				sent, pc, gathered(t, a, "dnsproxi_server_dropped_total", "reason=overloaded"), gathered(t, a, "dnsproxi_coalesced_total"))
			if lost := pc.lost(); lost > 0 {
				t.Errorf("the polite client lost %d queries for a fresh cached name while a crowd waited on slow names (%s)", lost, pc)
			}
		})
	}
}

// gathered reads a's registry: metric family name → the sum of its samples
// whose labels hold every pair of want ("k=v").
func gathered(t *testing.T, a *app, name string, want ...string) float64 {
	t.Helper()
	mfs, err := a.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, w := range want {
				found := false
				for _, l := range m.GetLabel() {
					if l.GetName()+"="+l.GetValue() == w {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			switch {
			case m.GetCounter() != nil:
				total += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				total += m.GetGauge().GetValue()
			}
		}
	}
	return total
}

// A mixed flood from 200 sources for 2 s, paced (about 1,500 a second, below
// what the kernel's socket buffer holds): unique names, a few popular names
// whose 1 s TTL runs out under the flood (cache, coalescing, prefetch,
// serve-stale), and slow names past the upstream timeout. Once it is over
// and every answer is in, the books must balance: every query taken is
// counted once, under one outcome or as dropped by the server; every one
// counted is a query-log line, written or dropped; nothing is left in
// flight or unanswered (an unanswered count that leaks would lower the
// server's bound for good).
func TestAttackMixedFloodCountsAddUp(t *testing.T) {
	up := startUpstream(t)
	up.SetDelay(1500 * time.Millisecond)
	cfg := floodConfig(t, up.Addr())
	cfg.CacheMaxTTL = time.Second
	a := startProxy(t, cfg, guard.RealClock{})
	to, err := net.ResolveUDPAddr("udp", a.addr())
	if err != nil {
		t.Fatal(err)
	}
	const sources, perSource = 200, 15 // 3,000 queries, within each source's burst of 50
	var sent atomic.Int64
	var wg sync.WaitGroup
	for s := range sources {
		c := udpFrom(t, fmt.Sprintf("127.1.%d.%d", s/250, s%250+1))
		wg.Go(func() {
			go func() { // drain the answers so that the socket never backs up
				buf := make([]byte, 1500)
				for {
					if _, _, err := c.ReadFromUDP(buf); err != nil {
						return
					}
				}
			}()
			for k := range perSource {
				// spread the sources' sends over 2 s
				time.Sleep(time.Duration(2000/perSource) * time.Millisecond)
				var name string
				switch k % 3 {
				case 0:
					name = fmt.Sprintf("u%d-%d.example.com", s, k)
				case 1:
					name = fmt.Sprintf("p%d.example.com", (s+k)%20)
				default:
					name = fmt.Sprintf("slow.s%d.example.com", (s+k)%10)
				}
				m := ednsQuery(name, dns.TypeA, 1232, false)
				m.Id = uint16(k)
				b, _ := m.Pack()
				if _, err := c.WriteToUDP(b, to); err == nil {
					sent.Add(1)
				}
			}
		})
	}
	wg.Wait()
	waitFor(t, "every query answered", func() bool {
		return a.server.Unanswered() == 0 && a.proxy.inflight.Load() == 0
	})
	total := gathered(t, a, "dnsproxi_queries_total")
	dropped := gathered(t, a, "dnsproxi_server_dropped_total")
	t.Logf("%d sent; counted %v, dropped %v; by outcome: forwarded %v cached %v stale %v coalesced %v upstream_error %v breaker_open %v overloaded %v client_limited %v",
		sent.Load(), total, dropped,
		gathered(t, a, "dnsproxi_queries_total", "outcome=forwarded"), gathered(t, a, "dnsproxi_queries_total", "outcome=cached"),
		gathered(t, a, "dnsproxi_queries_total", "outcome=stale"), gathered(t, a, "dnsproxi_coalesced_total"),
		gathered(t, a, "dnsproxi_queries_total", "outcome=upstream_error"), gathered(t, a, "dnsproxi_queries_total", "outcome=breaker_open"),
		gathered(t, a, "dnsproxi_queries_total", "outcome=overloaded"), gathered(t, a, "dnsproxi_queries_total", "outcome=client_limited"))
	if int64(total+dropped) != sent.Load() {
		t.Errorf("%d queries sent, %v counted under an outcome and %v dropped by the server", sent.Load(), total, dropped)
	}
	if g := gathered(t, a, "dnsproxi_queries_in_flight"); g != 0 {
		t.Errorf("dnsproxi_queries_in_flight reads %v with nothing in flight", g)
	}
	// The followers' places are given back as the last act of a landing,
	// just after the answers: a count that leaks would shrink the bound for
	// good.
	waitFor(t, "every follower's place to be given back", func() bool { return a.proxy.followers.Load() == 0 })
	// The query log: lines written and dropped, once the writer is done.
	var lines, logDropped float64
	deadline := time.Now().Add(5 * time.Second)
	for {
		lines, logDropped = gathered(t, a, "dnsproxi_query_log_lines_total"), gathered(t, a, "dnsproxi_query_log_dropped_total")
		if lines+logDropped >= total || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if lines+logDropped != total {
		t.Errorf("%v queries counted, %v query-log lines written and %v dropped", total, lines, logDropped)
	}
}

// TCP abuse from 120 sources at once, every feature on: connections that
// never send, that send half a query and stall, that pipeline 300 queries
// (big answers the cache holds, slow names others wait on too, unique
// names) and never read, and that do the same and then reset. Once every
// attacker has gone, what the proxy holds must be back where it was: no
// query unanswered or in flight (an unanswered count that leaks lowers the
// server's bound for good), and its goroutines back to the idle set. The
// polite client at 127.0.0.2 asks its cached name throughout.
func TestAttackTCPAbuseLeavesNothingBehind(t *testing.T) {
	up := startUpstream(t)
	up.SetDelay(1500 * time.Millisecond)
	cfg := floodConfig(t, up.Addr())
	a := startProxy(t, cfg, guard.RealClock{})
	idle := serverGoroutines()
	for _, name := range []string{"polite.example.com", "big.example.com"} {
		if r := askFrom(t, "tcp", "127.0.0.2", a.addr(), ednsQuery(name, dns.TypeA, 1232, false), 2*time.Second); r == nil || r.Rcode != dns.RcodeSuccess {
			t.Fatalf("priming the cache with %s: %v", name, r)
		}
	}
	waitFor(t, "the priming connections closed", func() bool { return a.server.Unanswered() == 0 })
	waitFor(t, "the priming connections' goroutines ended", func() bool { return serverGoroutines() <= idle })

	stop := make(chan struct{})
	pc := startPolite(t, a.addr(), "polite.example.com", stop)
	var conns []*net.TCPConn
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 120 {
		wg.Go(func() {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 2, byte(i/250), byte(i%250+1))}, Timeout: 2 * time.Second}
			c, err := d.Dial("tcp", a.addr())
			if err != nil {
				return
			}
			tc := c.(*net.TCPConn)
			mu.Lock()
			conns = append(conns, tc)
			mu.Unlock()
			switch i % 4 {
			case 0: // never sends
			case 1: // half a query
				tc.Write([]byte{0, 100, 1, 2, 3, 4, 5, 6, 7, 8})
			default: // pipelines and never reads; every fourth then resets
				tc.SetWriteDeadline(time.Now().Add(2 * time.Second))
				var buf []byte
				for k := range 300 {
					var name string
					switch k % 3 {
					case 0:
						name = "big.example.com"
					case 1:
						name = fmt.Sprintf("slow.s%d.example.com", k%7)
					default:
						name = fmt.Sprintf("t%d-%d.example.com", i, k)
					}
					m := ednsQuery(name, dns.TypeTXT, 1232, false)
					m.Id = uint16(k)
					b, _ := m.Pack()
					buf = binary.BigEndian.AppendUint16(buf, uint16(len(b)))
					buf = append(buf, b...)
				}
				tc.Write(buf)
				if i%4 == 3 {
					time.Sleep(50 * time.Millisecond)
					tc.SetLinger(0)
					tc.Close()
				}
			}
		})
	}
	wg.Wait()
	time.Sleep(1500 * time.Millisecond) // the slow names time out meanwhile
	mu.Lock()
	for _, c := range conns {
		c.Close()
	}
	mu.Unlock()
	close(stop)
	<-pc.done
	t.Logf("%d attacking connections; polite client: %s; dropped: slow reader %v, overloaded %v, idle evicted %v, conn limit %v",
		len(conns), pc,
		gathered(t, a, "dnsproxi_server_dropped_total", "reason=tcp_slow_reader"), gathered(t, a, "dnsproxi_server_dropped_total", "reason=overloaded"),
		gathered(t, a, "dnsproxi_server_dropped_total", "reason=tcp_idle_evicted"), gathered(t, a, "dnsproxi_server_dropped_total", "reason=tcp_conn_limit"))
	deadline := time.Now().Add(5 * time.Second)
	var unanswered int
	var inflight int64
	var gr int
	for {
		unanswered, inflight, gr = a.server.Unanswered(), a.proxy.inflight.Load(), serverGoroutines()
		if unanswered == 0 && inflight == 0 && gr <= idle || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("server goroutines: %d idle, %d after the attack", idle, gr)
	if unanswered != 0 || inflight != 0 {
		t.Errorf("5 s after the attackers left: %d queries unanswered, %d in flight", unanswered, inflight)
	}
	if gr > idle {
		t.Errorf("5 s after the attackers left: %d goroutines of the server, %d before the attack", gr, idle)
	}
}

// serverGoroutines counts the goroutines running the DNS server's code (its
// listeners, client connections and closes), not the upstreams' fixed set.
func serverGoroutines() int {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "dnsproxi/dnsserver.") {
			n++
		}
	}
	return n
}
