package main

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/dnsserver"
	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
	"dnsproxi/metrics"
	"dnsproxi/upstream"
)

// recorder is a ResponseWriter that keeps what is written.
type recorder struct {
	out     [][]byte
	dropped int
}

func (r *recorder) Write(b []byte) error {
	r.out = append(r.out, append([]byte(nil), b...))
	return nil
}
func (r *recorder) Drop() { r.dropped++ }

// waitingRecorder is a ResponseWriter for an answer that may come later,
// from another goroutine: done is closed by the one Write or Drop.
type waitingRecorder struct {
	recorder
	mu   sync.Mutex
	n    int
	done chan struct{}
}

func (r *waitingRecorder) Write(b []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recorder.Write(b)
	if r.n++; r.n == 1 {
		close(r.done)
	}
	return nil
}

func (r *waitingRecorder) Drop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recorder.Drop()
	if r.n++; r.n == 1 {
		close(r.done)
	}
}

// FuzzServePacket feeds arbitrary bytes through the server's parse step into
// handleQuery with every gate on — the access list, the per-client bucket,
// the global bucket (all three tight, so refusals happen, answered by slip),
// the breaker, the answer cache with serve-stale, its timer and prefetch —
// and on to a real upstream client (random IDs, 0x20, byte-exact reply
// validation) and a fake upstream on loopback, so that what
// comes back has passed the same checks as in production. The packet's
// first byte picks its client, 127.0.0.x, and the access list admits
// x < 128. Whatever comes in: no panic, exactly one answer or drop, and an
// answer carries the packet's ID, has QR set, parses, fits the client's UDP
// size (512 without EDNS, at most DNS_MAX_UDP_SIZE with it), and is REFUSED
// for a client outside the list.
func FuzzServePacket(f *testing.F) {
	q := new(dns.Msg)
	q.SetQuestion("www.example.com.", dns.TypeA)
	b, _ := q.Pack()
	f.Add(b)
	q.SetEdns0(4096, true)
	b, _ = q.Pack()
	f.Add(b)
	q.Id = 0xF000 // a client outside the list
	b, _ = q.Pack()
	f.Add(b)
	c := new(dns.Msg)
	c.SetQuestion("cached.example.com.", dns.TypeA)
	for _, id := range []uint16{0x0301, 0x0302} { // client 127.0.0.3 twice: the second is answered from the cache
		c.Id = id
		b, _ = c.Pack()
		f.Add(b)
	}

	fake, err := fakeupstream.Start("127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { fake.Close() })
	up, err := upstream.New(upstream.Config{Addr: fake.Addr(), Timeout: time.Second})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { up.Close() })
	const maxUDP = 1232
	clock := guard.NewManualClock(time.Unix(1e9, 0))
	m := metrics.New()
	answers, err := newAnswerCache(Config{CacheSize: 1 << 20, CacheStale: time.Hour, CacheStaleWait: 50 * time.Millisecond,
		CachePrefetch: true}, clock, m) // entries expire as the clock moves 100 ms an input
	if err != nil {
		f.Fatal(err)
	}
	p := &proxy{
		access: guard.NewAccessList(netip.MustParsePrefix("127.0.0.0/25")),
		denied: guard.NewTokenBucket(deniedRate, deniedBurst, clock),
		clients: &clientGates{udp: guard.NewClientLimiter(guard.ClientLimiterConfig{Rate: 1, Burst: 4, TableSize: 64}, clock),
			tcp: guard.NewClientLimiter(guard.ClientLimiterConfig{Rate: 1, Burst: 4, TableSize: 64}, clock)},
		limiter:     guard.NewTokenBucket(1, 64, clock),
		action:      LimitAction{Kind: ActionSlip, N: 2},
		maxInflight: 1000,
		maxUDPSize:  maxUDP,
		upstreams:   onePool(up, guard.NewBreaker(guard.BreakerConfig{}, guard.RealClock{})),
		metrics:     m,
		cache:       answers,
		clock:       clock,
	}
	var client netip.AddrPort // set before each packet; read by the handler, on the same goroutine
	srv := &dnsserver.Server{Handler: dnsserver.HandlerFunc(func(w dnsserver.ResponseWriter, q *dnsserver.Query) {
		q.Client = client
		p.handleQuery(w, q)
	})}
	f.Fuzz(func(t *testing.T, pkt []byte) {
		var x byte
		if len(pkt) > 0 {
			x = pkt[0]
		}
		client = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, x}), 5353)
		clock.Advance(100 * time.Millisecond) // the buckets refill now and then
		w := &waitingRecorder{done: make(chan struct{})}
		srv.ServePacket(w, append([]byte(nil), pkt...)) // the server may keep the bytes until the answer
		select {
		case <-w.done:
		case <-time.After(5 * time.Second):
			t.Fatal("no answer and no drop within 5s (the upstream's deadline is 1s)")
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if len(w.out)+w.dropped != 1 {
			t.Fatalf("%d answers and %d drops for one packet, want exactly one of them", len(w.out), w.dropped)
		}
		if len(w.out) == 0 {
			return
		}
		ans := w.out[0]
		if len(ans) < 12 || len(pkt) < 2 || binary.BigEndian.Uint16(ans) != binary.BigEndian.Uint16(pkt) {
			t.Fatalf("answer %x does not carry the query's ID", ans)
		}
		if ans[2]&0x80 == 0 {
			t.Fatal("answer without QR")
		}
		size := dns.MinMsgSize
		req := new(dns.Msg)
		if req.Unpack(pkt) == nil {
			if opt := req.IsEdns0(); opt != nil {
				size = min(max(size, int(opt.UDPSize())), maxUDP)
			}
		}
		if len(ans) > size {
			t.Fatalf("a %d-byte UDP answer for a client that takes %d", len(ans), size)
		}
		r := new(dns.Msg)
		if err := r.Unpack(ans); err != nil {
			t.Fatalf("the answer does not parse: %v", err)
		}
		if x >= 128 && r.Rcode != dns.RcodeRefused {
			t.Fatalf("a client outside the access list got %s", dns.RcodeToString[r.Rcode])
		}
	})
}

// FuzzRateLimit: DNS_RATE_LIMIT never panics, and what it accepts is a
// working gate within the documented bounds that prints back to itself.
func FuzzRateLimit(f *testing.F) {
	for _, s := range []string{"5", "5,5", "0.5", "1e8,1", " 3 , 4 ", "5,x", "-1", "NaN", "Inf", "1e300", "0.001",
		"1,99999999999999999999", ",", "", "off", "OFF", "0x1p-2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var r RateLimit
		if err := r.Decode(s); err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("%q: error of more than one line: %v", s, err)
			}
			return
		}
		if !r.On() {
			return // empty or off
		}
		if !(r.Rate >= minRate && r.Rate <= maxRate) || r.Burst < 1 || r.Burst > maxBurst {
			t.Fatalf("%q accepted as %+v", s, r)
		}
		guard.NewTokenBucket(r.Rate, r.Burst, guard.RealClock{}) // must not panic
		var back RateLimit
		if err := back.Decode(r.String()); err != nil || back != r {
			t.Fatalf("%q → %+v → %q → %+v, %v", s, r, r.String(), back, err)
		}
	})
}

// FuzzConfigAddresses: the address rule never panics, never asks a resolver
// about anything but a well-formed host name, never lets port 0 through to
// the upstream, and what it accepts it reads back the same.
func FuzzConfigAddresses(f *testing.F) {
	for _, s := range []string{"127.0.0.1:53", "[::1]:53", "localhost:53", "LOCALHOST.:0", ":53", "1.2.3.4", "[::1",
		"a:b:c", "127.0.0.1:99999", "off", "", "dns.example:53", "a..b:53", "[fe80::1%eth0]:53", "127.0.0.1:+53"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, anyPort := range []bool{false, true} {
			r := &fakeResolver{t: t}
			ap, err := resolveAddr(s, anyPort, r)
			if err != nil {
				if msg := addrError("DNS_X", s, "host:port", err).Error(); strings.Contains(msg, "\n") {
					t.Fatalf("%q: error of more than one line: %s", s, msg)
				}
				continue
			}
			if !ap.IsValid() || (!anyPort && ap.Port() == 0) {
				t.Fatalf("%q (any port %v) accepted as %v", s, anyPort, ap)
			}
			if again, err := resolveAddr(ap.String(), anyPort, r); err != nil || again != ap {
				t.Fatalf("%q → %v → %v, %v", s, ap, again, err)
			}
		}
	})
}
