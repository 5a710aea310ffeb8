package upstream

import (
	"errors"
	"math/rand/v2"
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
	pending map[uint16]*call
	closed  bool
}

// maxPending keeps some IDs free so that picking a random free one stays quick.
const maxPending = 60000

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
	s := &udpSocket{u: u, conn: conn, writer: w, reader: r, done: make(chan struct{}), pending: make(map[uint16]*call)}
	go s.read()
	return s, nil
}

// close stops the socket and ends every query still waiting on it.
func (s *udpSocket) close() {
	s.mu.Lock()
	s.closed = true
	left := make([]*call, 0, len(s.pending))
	for id, c := range s.pending {
		left = append(left, c)
		delete(s.pending, id)
	}
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
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	if len(s.pending) >= maxPending {
		s.mu.Unlock()
		return ErrBusy
	}
	var id uint16
	for {
		id = uint16(rand.Uint32())
		if _, taken := s.pending[id]; !taken {
			break
		}
	}
	wire.SetID(c.wire, id)
	s.pending[id] = c
	// Queued under the lock: once c is in the table, a reply or the sweeper
	// may finish and recycle it, and c.wire with it.
	err := s.writer.Send(netip.AddrPort{}, c.wire)
	if err != nil {
		delete(s.pending, id)
	}
	s.mu.Unlock()
	return err
}

// take removes and returns the query waiting under id if reply answers it.
func (s *udpSocket) take(id uint16, reply []byte) *call {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.pending[id]
	if c == nil || !c.answers(reply) {
		return nil // late, duplicate, spoofed or not an answer: keep waiting for the real one
	}
	delete(s.pending, id)
	return c
}

// takeExpired removes the queries whose deadline is before now and appends them to out.
func (s *udpSocket) takeExpired(now time.Time, out []*call) []*call {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, c := range s.pending {
		if now.After(c.deadline) {
			delete(s.pending, id)
			out = append(out, c)
		}
	}
	return out
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
			c := s.take(wire.ID(reply), reply)
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
