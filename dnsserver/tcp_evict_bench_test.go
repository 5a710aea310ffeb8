package dnsserver

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// BenchmarkTCPPipelinedConns measures one query and its answer over TCP
// with 16 connections pipelining at once: every query passes the server's
// connection lock, to move its connection to the back of the list.
func BenchmarkTCPPipelinedConns(b *testing.B) {
	const conns = 16
	s := &Server{Addr: "127.0.0.1:0", Handler: stackEcho}
	if err := s.Start(); err != nil {
		b.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	m := new(dns.Msg).SetQuestion("www.example.com.", dns.TypeA)
	q, err := m.Pack()
	if err != nil {
		b.Fatal(err)
	}
	query := append(binary.BigEndian.AppendUint16(nil, uint16(len(q))), q...)
	cs := make([]net.Conn, conns)
	for i := range cs {
		c, err := net.Dial("tcp", s.LocalAddr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Minute))
		cs[i] = c
	}
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	errs := make(chan error, 2*conns)
	for i, c := range cs {
		n := b.N / conns
		if i < b.N%conns {
			n++
		}
		wg.Go(func() {
			for range n {
				if _, err := c.Write(query); err != nil {
					errs <- err
					return
				}
			}
		})
		wg.Go(func() {
			var lenBuf [2]byte
			buf := make([]byte, 65535)
			for range n {
				if _, err := io.ReadFull(c, lenBuf[:]); err != nil {
					errs <- err
					return
				}
				if _, err := io.ReadFull(c, buf[:binary.BigEndian.Uint16(lenBuf[:])]); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// BenchmarkTCPEvictionFlood measures one new connection that takes the slot
// of an idle one, every slot taken: the rate at which a single client that
// opens connections and leaves them open closes other clients' idle ones.
// The client keeps each connection open (b.N of them: run it with a small
// -benchtime, under the open-file limit).
func BenchmarkTCPEvictionFlood(b *testing.B) {
	const slots = 64
	var mu sync.Mutex
	evicted, want := 0, 0
	done := make(chan struct{})
	s := &Server{Addr: "127.0.0.1:0", MaxTCPConns: slots, TCPIdleTimeout: time.Minute,
		OnDropped: func(reason string) {
			if reason != "tcp_idle_evicted" {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if evicted++; evicted == want {
				close(done)
			}
		}}
	s.Handler = echo
	if err := s.Start(); err != nil {
		b.Fatal(err)
	}
	defer s.Shutdown(context.Background())
	addr := s.LocalAddr().String()
	cs := make([]net.Conn, 0, slots+b.N)
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	dial := func() {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		cs = append(cs, c)
	}
	for range slots {
		dial()
	}
	// Every slot taken before the clock starts: the server has accepted
	// them all once the last one is answered.
	if _, err := askOn(cs[slots-1], "warm.example.", 5*time.Second); err != nil {
		b.Fatal(err)
	}
	mu.Lock()
	want = b.N
	mu.Unlock()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		dial()
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		b.Fatalf("%d of %d new connections evicted one in a minute", evicted, b.N)
	}
}
