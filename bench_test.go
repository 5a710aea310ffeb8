package main

import (
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
)

// echoUpstream answers every query with itself, QR set: a valid empty reply
// that costs no allocation, so a benchmark's allocs/op are the proxy's own.
func echoUpstream(b *testing.B) string {
	b.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
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

// benchProxy starts the whole proxy, with both gates on (never tripping) or off.
func benchProxy(b *testing.B, gates bool) string {
	b.Helper()
	cfg := testConfig(echoUpstream(b))
	if gates {
		cfg.RateLimit = RateLimit{Rate: 1e9, Burst: 1e9}
		cfg.BreakerThreshold = 50
	}
	cfg.MaxInflight = 0
	a, err := newApp(cfg, guard.RealClock{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	if err := a.start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.shutdown(b.Context()) })
	return a.addr()
}

// roundTrip sends the packed query q under a new ID on c and reads the answer.
func roundTrip(b *testing.B, c *net.UDPConn, q, buf []byte, id uint16) {
	binary.BigEndian.PutUint16(q, id)
	if _, err := c.Write(q); err != nil {
		b.Fatal(err)
	}
	for {
		n, err := c.Read(buf)
		if err != nil {
			b.Fatal(err)
		}
		if n >= 12 && binary.BigEndian.Uint16(buf) == id {
			return
		}
	}
}

func dialBench(b *testing.B, addr string) *net.UDPConn {
	raddr, _ := net.ResolveUDPAddr("udp", addr)
	c, err := net.DialUDP("udp", nil, raddr)
	if err != nil {
		b.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(time.Minute))
	return c
}

// BenchmarkUDPPath drives queries through the whole UDP path: client
// socket → proxy → upstream → proxy → client. "serial" is one query at a
// time (ns/op is the round trip); "parallel" keeps 8 clients per core busy,
// with both gates on and with both off, in the same run. allocs/op are the
// proxy's own: the upstream and the clients allocate nothing.
func BenchmarkUDPPath(b *testing.B) {
	q := new(dns.Msg)
	q.SetQuestion("www.example.com.", dns.TypeA)
	wire, _ := q.Pack()
	on, off := benchProxy(b, true), benchProxy(b, false)
	b.Run("serial", func(b *testing.B) {
		c := dialBench(b, on)
		defer c.Close()
		buf := make([]byte, 65535)
		b.ReportAllocs()
		id := uint16(0)
		for b.Loop() {
			id++
			roundTrip(b, c, wire, buf, id)
		}
	})
	// "serial-unique" asks a new name every time, as a load test's list of
	// names does: no answer is shared, every query is a flight of its own.
	b.Run("serial-unique", func(b *testing.B) {
		c := dialBench(b, on)
		defer c.Close()
		buf := make([]byte, 65535)
		uq := append([]byte(nil), wire...)
		label := uq[12:] // the question's first label, "www": its three letters vary
		b.ReportAllocs()
		id, n := uint16(0), 0
		for b.Loop() {
			id++
			n++
			label[1], label[2], label[3] = 'a'+byte(n%26), 'a'+byte(n/26%26), 'a'+byte(n/676%26)
			roundTrip(b, c, uq, buf, id)
		}
	})
	for _, tt := range []struct{ name, addr string }{{"parallel-gates-off", off}, {"parallel-gates-on", on}} {
		b.Run(tt.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(8) // several clients per core keep the proxy busy
			b.RunParallel(func(pb *testing.PB) {
				c := dialBench(b, tt.addr)
				defer c.Close()
				myQ := append([]byte(nil), wire...)
				buf := make([]byte, 65535)
				id := uint16(0)
				for pb.Next() {
					id++
					roundTrip(b, c, myQ, buf, id)
				}
			})
		})
	}
}
