package dnsserver

import (
	"errors"
	"net"
	"net/netip"
	"sync"

	"github.com/miekg/dns"
)

// udpBufSize is the largest datagram read; a query is rarely near it, but a
// smaller buffer would silently cut one that is.
const udpBufSize = 65535

var udpBufs = sync.Pool{New: func() any { b := make([]byte, udpBufSize); return &b }}

func (s *Server) serveUDP() {
	defer s.wg.Done()
	for {
		bp := udpBufs.Get().(*[]byte)
		n, from, err := s.udp.ReadFromUDPAddrPort(*bp)
		if err != nil {
			udpBufs.Put(bp)
			if s.closing.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			continue // a transient error (ICMP unreachable from an earlier reply): keep serving
		}
		w := &udpWriter{conn: s.udp, to: from}
		if !s.tryHandler() {
			s.dropped("overloaded")
			if h := refuse((*bp)[:n]); h != nil {
				w.Write(h)
			}
			udpBufs.Put(bp)
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer s.releaseHandler()
			req := s.parse(w, (*bp)[:n])
			udpBufs.Put(bp) // back before the exchange: the message holds no reference to it
			if req != nil {
				s.Handler.ServeDNS(w, req)
			}
		}()
	}
}

// udpWriter answers one UDP query.
type udpWriter struct {
	conn *net.UDPConn
	to   netip.AddrPort
}

var _ dns.ResponseWriter = (*udpWriter)(nil)

func (w *udpWriter) LocalAddr() net.Addr  { return w.conn.LocalAddr() }
func (w *udpWriter) RemoteAddr() net.Addr { return net.UDPAddrFromAddrPort(w.to) }
func (w *udpWriter) WriteMsg(m *dns.Msg) error {
	b, err := m.Pack()
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}
func (w *udpWriter) Write(b []byte) (int, error) { return w.conn.WriteToUDPAddrPort(b, w.to) }
func (w *udpWriter) Close() error                { return nil }
func (w *udpWriter) TsigStatus() error           { return nil }
func (w *udpWriter) TsigTimersOnly(bool)         {}
func (w *udpWriter) Hijack()                     {}
