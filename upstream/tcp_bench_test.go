package upstream

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// tcpEchoServer answers every TCP frame with itself, QR set, on each
// connection it accepts, writing the replies as they gather.
func tcpEchoServer(b *testing.B) string {
	b.Helper()
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				r, w := bufio.NewReader(c), bufio.NewWriter(c)
				frame := make([]byte, 65537)
				for {
					if _, err := io.ReadFull(r, frame[:2]); err != nil {
						return
					}
					n := int(binary.BigEndian.Uint16(frame))
					if _, err := io.ReadFull(r, frame[2:2+n]); err != nil {
						return
					}
					frame[4] |= 0x80
					w.Write(frame[:2+n])
					if r.Buffered() == 0 && w.Flush() != nil {
						return
					}
				}
			})
		}
	})
	b.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return l.Addr().String()
}

// BenchmarkForwardTCP is one upstream query's round trip through Forward
// over the pipelined TCP connections, one at a time and with 64 in flight
// per core.
func BenchmarkForwardTCP(b *testing.B) {
	addr := tcpEchoServer(b)
	m := new(dns.Msg)
	m.SetQuestion("www.example.com.", dns.TypeA)
	query, _ := m.Pack()
	u, err := New(Config{Addr: addr, Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { u.Close() })
	b.Run("serial", func(b *testing.B) {
		done := make(chan error, 1)
		result := func(_, _ []byte, err error) { done <- err }
		b.ReportAllocs()
		for b.Loop() {
			u.Forward(query, "tcp", result)
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(64)
		b.RunParallel(func(pb *testing.PB) {
			done := make(chan error, 1)
			result := func(_, _ []byte, err error) { done <- err }
			for pb.Next() {
				u.Forward(query, "tcp", result)
				if err := <-done; err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
