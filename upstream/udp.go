package upstream

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// udpSocket is one long-lived connected UDP socket. Exchanges register under
// a random free ID; one reader goroutine hands each valid reply to its
// exchange and ignores everything else.
type udpSocket struct {
	conn *net.UDPConn

	mu      sync.Mutex
	pending map[uint16]*udpCall
	closed  bool
}

// udpCall is one exchange waiting on a socket.
type udpCall struct {
	q     dns.Question
	reply chan *dns.Msg // buffered 1: the reader never blocks
}

// maxPending keeps some IDs free so that picking a random free one stays quick.
const maxPending = 60000

func dialUDP(raddr *net.UDPAddr) (*udpSocket, error) {
	conn, err := net.DialUDP("udp", nil, raddr)
	if err != nil {
		return nil, err
	}
	s := &udpSocket{conn: conn, pending: make(map[uint16]*udpCall)}
	go s.read()
	return s, nil
}

func (s *udpSocket) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.conn.Close()
}

func (s *udpSocket) exchange(ctx context.Context, wire []byte, q dns.Question, deadline time.Time) (*dns.Msg, error) {
	call := &udpCall{q: q, reply: make(chan *dns.Msg, 1)}
	id, err := s.register(call)
	if err != nil {
		return nil, err
	}
	defer s.unregister(id)

	out := make([]byte, len(wire)) // wire is shared with a TC retry: keep it intact
	copy(out, wire)
	binary.BigEndian.PutUint16(out, id)
	if _, err := s.conn.Write(out); err != nil {
		return nil, err
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case m := <-call.reply:
		return m, nil
	case <-timer.C:
		return nil, ErrTimeout
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// register files call under a random ID that no other exchange on this
// socket is using.
func (s *udpSocket) register(call *udpCall) (uint16, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	if len(s.pending) >= maxPending {
		return 0, ErrBusy
	}
	for {
		id := uint16(rand.Uint32())
		if _, taken := s.pending[id]; !taken {
			s.pending[id] = call
			return id, nil
		}
	}
}

func (s *udpSocket) unregister(id uint16) {
	s.mu.Lock()
	delete(s.pending, id)
	s.mu.Unlock()
}

// read hands replies to their exchanges until the socket is closed.
func (s *udpSocket) read() {
	buf := make([]byte, dns.MaxMsgSize)
	for {
		n, err := s.conn.Read(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // ICMP port unreachable and the like: the exchange times out
		}
		if n < 12 {
			continue
		}
		id := binary.BigEndian.Uint16(buf)
		s.mu.Lock()
		call := s.pending[id]
		s.mu.Unlock()
		if call == nil {
			continue // late, duplicate or spoofed
		}
		m := new(dns.Msg)
		if m.Unpack(buf[:n]) != nil || !answers(m, id, call.q) {
			continue // not the answer: keep waiting for the real one
		}
		select {
		case call.reply <- m:
		default: // a second valid copy: the first one won
		}
	}
}
