package upstream

import (
	crand "crypto/rand"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// echoServer answers every query with itself, QR set: a valid reply that
// costs the server almost nothing, so the benchmark measures the client.
func echoServer(b *testing.B) string {
	b.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	c.SetReadBuffer(4 << 20)
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			buf[2] |= 0x80
			c.WriteToUDPAddrPort(buf[:n], from)
		}
	})
	b.Cleanup(func() { c.Close(); wg.Wait() })
	return c.LocalAddr().String()
}

// BenchmarkForwardUDP is one upstream query's round trip through Forward,
// with 0x20 on and off, one at a time and with 64 in flight per core. The
// default bounds rotate a socket every 10,000 queries, so rotation is in
// the figures.
func BenchmarkForwardUDP(b *testing.B) {
	addr := echoServer(b)
	m := new(dns.Msg)
	m.SetQuestion("www.example.com.", dns.TypeA)
	query, _ := m.Pack()
	for _, tt := range []struct {
		name   string
		no0x20 bool
	}{{"0x20", false}, {"plain", true}} {
		u, err := New(Config{Addr: addr, Disable0x20: tt.no0x20, Timeout: 5 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { u.Close() })
		b.Run(tt.name+"/serial", func(b *testing.B) {
			done := make(chan error, 1)
			result := func(_, _ []byte, err error) { done <- err }
			b.ReportAllocs()
			for b.Loop() {
				u.Forward(query, "udp", result)
				if err := <-done; err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tt.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(64)
			b.RunParallel(func(pb *testing.PB) {
				done := make(chan error, 1)
				result := func(_, _ []byte, err error) { done <- err }
				for pb.Next() {
					u.Forward(query, "udp", result)
					if err := <-done; err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkEntropy is the cost of the random bits of one query (an ID and a
// word of 0x20 case): from the ChaCha8 stream, and from crypto/rand.
func BenchmarkEntropy(b *testing.B) {
	b.Run("chacha8", func(b *testing.B) {
		var e entropy
		b.ReportAllocs()
		for b.Loop() {
			_, _ = e.uint64(), e.uint64()
		}
	})
	b.Run("crypto-rand", func(b *testing.B) {
		var buf [16]byte
		b.ReportAllocs()
		for b.Loop() {
			crand.Read(buf[:])
		}
	})
}

// BenchmarkSocketOpen is what a rotation costs: a socket on a fresh random
// port with its reader and writer, and its closing. At the default bound it
// is paid once every 10,000 queries.
func BenchmarkSocketOpen(b *testing.B) {
	u, err := New(Config{Addr: echoServer(b), UDPSockets: 1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { u.Close() })
	b.ReportAllocs()
	for b.Loop() {
		s, err := dialUDP(u, u.raddr, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		s.close()
	}
}
