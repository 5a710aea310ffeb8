package dnsserver

import (
	"errors"
	"net"
	"net/netip"

	"github.com/miekg/dns"

	"dnsproxi/internal/batchio"
	"dnsproxi/internal/wire"
)

// udpBufSize is the largest query read over UDP. Queries are small; a
// larger one is handed to the handler as Malformed. The buffers are kept small on purpose: the
// garbage collector lets the heap grow in proportion to what is live, and
// 64 KiB slots would let megabytes of garbage pile up between collections.
const udpBufSize = 4096

// listenSocket is one of the UDP sockets sharing the port: read in batches by
// its reader, written in batches by its writer.
type listenSocket struct {
	conn   *net.UDPConn
	reader *batchio.Reader
	writer *batchio.Writer
}

// listenUDP binds n sockets to ap, sharing the port where the system
// allows. It reports whether others held the port first (listenFirst).
func listenUDP(ap netip.AddrPort, n int) (socks []*listenSocket, shared bool, err error) {
	for i := range n {
		var conn *net.UDPConn
		if i == 0 {
			conn, shared, err = listenFirst(ap)
		} else {
			conn, err = listenReusePort(ap)
		}
		if err != nil {
			for _, s := range socks {
				s.close()
			}
			return nil, false, err
		}
		if i == 0 {
			ap = conn.LocalAddr().(*net.UDPAddr).AddrPort() // the others join the port the first was given
		}
		conn.SetReadBuffer(4 << 20)
		conn.SetWriteBuffer(4 << 20)
		r, err := batchio.NewReader(conn, batchio.MaxBatch, udpBufSize)
		if err == nil {
			var w *batchio.Writer
			if w, err = batchio.NewWriter(conn); err == nil {
				socks = append(socks, &listenSocket{conn: conn, reader: r, writer: w})
				continue
			}
		}
		conn.Close()
		for _, s := range socks {
			s.close()
		}
		return nil, false, err
	}
	return socks, shared, nil
}

func (u *listenSocket) close() {
	u.writer.Close() // sends what is queued first
	u.conn.Close()
}

// serveUDP reads batches of packets and hands each to the handler. Nothing
// here blocks but the read: the handler answers through the socket's writer,
// held while the batch is served so that the answers written meanwhile (cache
// hits, refusals) go out in one sendmmsg with one wake-up of its goroutine.
func (s *Server) serveUDP(u *listenSocket) {
	defer s.wg.Done()
	serve := func(n int) { s.serveBatch(u, n) }
	for {
		err := u.reader.Serve(serve)
		if s.closing.Load() || errors.Is(err, net.ErrClosed) {
			return
		}
		// A transient error (ICMP unreachable from an earlier reply): keep serving.
	}
}

// serveBatch hands the n packets the socket's reader holds to the handler.
func (s *Server) serveBatch(u *listenSocket, n int) {
	u.writer.Hold()
	forwards := s.Forwards.Hold()
	for i := range n {
		to := u.reader.Addr(i)
		w := &udpWriter{out: u.writer, to: to}
		w.start(s)
		client := netip.AddrPortFrom(to.Addr().Unmap(), to.Port())
		if u.reader.Truncated(i) {
			s.tooLarge(w, u.reader.Packet(i), client)
			continue
		}
		s.serve(w, &w.q, u.reader.Packet(i), "udp", client)
	}
	batchio.Release(forwards)
	u.writer.Release()
}

// udpWriter answers one UDP query.
type udpWriter struct {
	answer
	out *batchio.Writer
	to  netip.AddrPort
	q   Query // allocated with the writer: one allocation per query, not two
}

// Write queues the answer on the socket's writer, once. The query counts as
// answered only once it is queued: Shutdown closes the writer after that.
func (w *udpWriter) Write(reply []byte) error {
	if !w.claim() {
		return ErrAnswered
	}
	err := w.out.Send(w.to, reply)
	w.s.finished(1)
	return err
}

// Drop ends the query without an answer.
func (w *udpWriter) Drop() { w.finish() }

// tooLarge hands a query larger than udpBufSize to the handler marked
// Malformed, to be answered (FORMERR) or not as its gates decide; pkt is its
// first udpBufSize bytes. A response is dropped.
func (s *Server) tooLarge(w *udpWriter, pkt []byte, client netip.AddrPort) {
	if !s.parse(&w.q, pkt, "udp") {
		w.Drop()
		return
	}
	w.q.Client, w.q.Malformed, w.q.EDNS, w.q.UDPSize = client, true, wire.EDNS{}, dns.MinMsgSize
	s.dispatch(w, &w.q)
}
