package main

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"dnsproxi/dnsserver"
	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
	"dnsproxi/metrics"
	"dnsproxi/upstream"
)

// memUpstream answers from the fake zone without a network, at once.
type memUpstream struct{}

func (memUpstream) Forward(query []byte, _ string, done upstream.Result) {
	req := new(dns.Msg)
	if err := req.Unpack(query); err != nil {
		done(query, nil, err)
		return
	}
	reply, err := fakeupstream.Answer(req).Pack()
	done(query, reply, err)
}

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

// FuzzServePacket feeds arbitrary bytes through the server's parse step into
// handleQuery with both gates on. Whatever comes in: no panic, at most one
// answer, and an answer carries the packet's ID, has QR set, parses, and
// fits the client's UDP size.
func FuzzServePacket(f *testing.F) {
	q := new(dns.Msg)
	q.SetQuestion("www.example.com.", dns.TypeA)
	b, _ := q.Pack()
	f.Add(b)
	q.SetEdns0(4096, true)
	b, _ = q.Pack()
	f.Add(b)

	m := metrics.New()
	p := &proxy{
		limiter:     guard.NewTokenBucket(math.MaxInt32, math.MaxInt32, guard.RealClock{}),
		maxInflight: 1000,
		upstreams:   onePool(memUpstream{}, guard.NewBreaker(guard.BreakerConfig{}, guard.RealClock{})),
		metrics:     m,
	}
	srv := &dnsserver.Server{Handler: dnsserver.HandlerFunc(p.handleQuery)}
	f.Fuzz(func(t *testing.T, pkt []byte) {
		w := &recorder{}
		srv.ServePacket(w, pkt)
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
				size = max(size, int(opt.UDPSize()))
			}
		}
		if len(ans) > size {
			t.Fatalf("a %d-byte UDP answer for a client that takes %d", len(ans), size)
		}
		if err := new(dns.Msg).Unpack(ans); err != nil {
			t.Fatalf("the answer does not parse: %v", err)
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
