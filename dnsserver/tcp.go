package dnsserver

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/miekg/dns"
)

func (s *Server) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.tcp.AcceptTCP()
		if err != nil {
			if s.closing.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // out of file descriptors: let some close
			continue
		}
		select {
		case s.tcpSlots <- struct{}{}:
		default:
			s.dropped("tcp_conn_limit")
			c.Close()
			continue
		}
		s.mu.Lock()
		if s.closing.Load() {
			s.mu.Unlock()
			c.Close()
			<-s.tcpSlots
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serveConn(c)
	}
}

// serveConn reads queries off one connection and answers each as soon as its
// handler is done, not in order. At most TCPPipeline are in flight.
func (s *Server) serveConn(c *net.TCPConn) {
	defer s.wg.Done()
	w := &tcpWriter{conn: c}
	var inflight sync.WaitGroup
	pipeline := make(chan struct{}, s.TCPPipeline)
	defer func() {
		inflight.Wait()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
		<-s.tcpSlots
	}()
	var lenBuf [2]byte
	for !s.closing.Load() {
		// One deadline covers the length prefix and the body: a query that
		// stalls half-way costs its sender the connection, nobody else.
		c.SetReadDeadline(time.Now().Add(s.TCPIdleTimeout))
		if _, err := io.ReadFull(c, lenBuf[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint16(lenBuf[:])
		if n < 12 {
			return // not even a header: the stream cannot be trusted any more
		}
		pkt := make([]byte, n)
		if _, err := io.ReadFull(c, pkt); err != nil {
			return
		}
		pipeline <- struct{}{}
		if !s.tryHandler() {
			s.dropped("overloaded")
			if h := refuse(pkt); h != nil {
				w.Write(h)
			}
			<-pipeline
			continue
		}
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			defer func() { <-pipeline }()
			defer s.releaseHandler()
			s.ServePacket(w, pkt)
		}()
	}
}

// tcpWriter answers queries on one connection; writes are serialised because
// handlers of pipelined queries answer concurrently.
type tcpWriter struct {
	mu   sync.Mutex
	conn *net.TCPConn
}

var _ dns.ResponseWriter = (*tcpWriter)(nil)

func (w *tcpWriter) LocalAddr() net.Addr  { return w.conn.LocalAddr() }
func (w *tcpWriter) RemoteAddr() net.Addr { return w.conn.RemoteAddr() }
func (w *tcpWriter) WriteMsg(m *dns.Msg) error {
	b, err := m.Pack()
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// Write sends one message with its length prefix.
func (w *tcpWriter) Write(b []byte) (int, error) {
	if len(b) > dns.MaxMsgSize {
		return 0, dns.ErrBuf
	}
	framed := make([]byte, 2+len(b))
	binary.BigEndian.PutUint16(framed, uint16(len(b)))
	copy(framed[2:], b)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.conn.SetWriteDeadline(time.Now().Add(writeTimeout)) // a client that never reads costs only itself
	if _, err := w.conn.Write(framed); err != nil {
		return 0, err
	}
	return len(b), nil
}
func (w *tcpWriter) Close() error        { return w.conn.Close() }
func (w *tcpWriter) TsigStatus() error   { return nil }
func (w *tcpWriter) TsigTimersOnly(bool) {}
func (w *tcpWriter) Hijack()             {}
