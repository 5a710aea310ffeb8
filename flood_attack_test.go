package main

// Attacks on the whole proxy with every feature on (access list, per-client
// and global buckets, breaker, cache with serve-stale and prefetch,
// coalescing, in-flight cap, query log), by floods from many 127.x sources,
// while a polite client at 127.0.0.2 asks a name the cache holds.

import (
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

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
	cfg.ClientRateLimit = RateLimit{Rate: 50, Burst: 50}
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
// same few slow names at once, each client within its own bucket. Each name
// goes upstream once per 65 askers (coalescing), well within the in-flight
// cap, and its askers wait as followers. The polite client asks a name the
// cache holds, fresh: nothing of the crowd's should stand between it and
// its cached answer.
func TestAttackSlowNameCrowdSilencesCachedAnswers(t *testing.T) {
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
	for i := range 60 {
		names = append(names, fmt.Sprintf("slow.n%d.example.com", i))
	}
	// 60 names × 60 askers: 60 queries upstream (60 of 1,000 places under
	// the cap), 3,540 followers; 3,600 queries from 200 sources, 18 each.
	sent := floodSources(t, a.addr(), names, 60, 200)
	time.Sleep(700 * time.Millisecond) // the crowd waits on the upstream for 1 s
	close(stop)
	<-pc.done
	t.Logf("crowd: %d sent; polite client: %s; server dropped overloaded: %d",
		sent, pc, int(testutil.ToFloat64(a.metrics.Dropped.WithLabelValues("overloaded"))))
	if lost := pc.lost(); lost > 0 {
		t.Errorf("the polite client lost %d queries for a fresh cached name while a crowd waited on slow names (%s)", lost, pc)
	}
}
