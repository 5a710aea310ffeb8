package upstream

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"

	"dnsproxi/internal/batchio"
	"dnsproxi/internal/wire"
)

// udpSocket is one long-lived connected UDP socket. Queries are filed under
// a random free ID; one reader hands each valid reply to its query and
// ignores everything else.
type udpSocket struct {
	u      *Upstream
	conn   *net.UDPConn
	writer *batchio.Writer
	reader *batchio.Reader
	done   chan struct{} // closed when the reader has stopped

	mu      sync.Mutex
	pending pending
	closed  bool
}

// replyBufSize is the largest UDP reply read whole; a larger one (rare: a
// client asked for more than 8 KB with EDNS) is fetched again over TCP. The
// buffers are kept small for the garbage collector's sake: see dnsserver's
// udpBufSize.
const replyBufSize = 8192

func dialUDP(u *Upstream, raddr *net.UDPAddr) (*udpSocket, error) {
	conn, err := net.DialUDP("udp", nil, raddr)
	if err != nil {
		return nil, err
	}
	conn.SetReadBuffer(4 << 20)
	conn.SetWriteBuffer(4 << 20)
	r, err := batchio.NewReader(conn, batchio.MaxBatch, replyBufSize)
	if err != nil {
		conn.Close()
		return nil, err
	}
	w, err := batchio.NewWriter(conn)
	if err != nil {
		conn.Close()
		return nil, err
	}
	s := &udpSocket{u: u, conn: conn, writer: w, reader: r, done: make(chan struct{}), pending: make(pending)}
	go s.read()
	return s, nil
}

// close stops the socket and ends every query still waiting on it.
func (s *udpSocket) close() {
	s.mu.Lock()
	s.closed = true
	left := s.pending.takeAll(nil)
	s.mu.Unlock()
	s.writer.Close()
	s.conn.Close()
	<-s.done
	for _, c := range left {
		c.finish(nil, ErrClosed)
	}
}

// send files c under a random free ID and queues it for the writer.
func (s *udpSocket) send(c *call) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if err := s.pending.add(c); err != nil {
		return err
	}
	// Queued under the lock: once c is in the table, a reply or the sweeper
	// may finish and recycle it, and c.wire with it.
	err := s.writer.Send(netip.AddrPort{}, c.wire)
	if err != nil {
		delete(s.pending, wire.ID(c.wire))
	}
	return err
}

// take removes and returns the query reply answers, if it is waiting here.
func (s *udpSocket) take(reply []byte) *call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending.take(reply)
}

// takeExpired removes the queries whose deadline is before now and appends them to out.
func (s *udpSocket) takeExpired(now time.Time, out []*call) []*call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pending.takeExpired(now, out)
}

// read hands replies to their queries until the socket is closed.
func (s *udpSocket) read() {
	defer close(s.done)
	for {
		n, err := s.reader.Read()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(time.Millisecond) // ICMP port unreachable and the like: the queries time out
			continue
		}
		for i := range n {
			reply := s.reader.Packet(i)
			if len(reply) < wire.HeaderLen {
				continue
			}
			c := s.take(reply)
			if c == nil {
				continue
			}
			if wire.Flags(reply)&wire.FlagTC != 0 || s.reader.Truncated(i) {
				s.u.forwardTCP(c) // the whole answer, over TCP, before the same deadline
				continue
			}
			c.finish(reply, nil)
		}
	}
}
