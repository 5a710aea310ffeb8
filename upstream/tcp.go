package upstream

import (
	"context"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// tcpPool keeps idle connections to the upstream for reuse, newest last,
// and closes those idle for longer than idle.
type tcpPool struct {
	addr string
	max  int
	idle time.Duration

	mu     sync.Mutex
	conns  []idleConn
	closed bool
}

type idleConn struct {
	conn  net.Conn
	since time.Time
}

func newTCPPool(addr string, max int, idle time.Duration) *tcpPool {
	return &tcpPool{addr: addr, max: max, idle: idle}
}

// get returns an idle connection that has not expired, or nil.
func (p *tcpPool) get() net.Conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for len(p.conns) > 0 {
		c := p.conns[len(p.conns)-1]
		p.conns = p.conns[:len(p.conns)-1]
		if now.Sub(c.since) < p.idle {
			return c.conn
		}
		c.conn.Close()
	}
	return nil
}

func (p *tcpPool) put(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.conns) >= p.max {
		c.Close()
		return
	}
	p.conns = append(p.conns, idleConn{c, time.Now()})
}

func (p *tcpPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, c := range p.conns {
		c.conn.Close()
	}
	p.conns = nil
}

// exchange sends wire over a pooled or new connection. A pooled connection
// may have been closed by the upstream while idle; then the query is sent
// once more on a fresh one.
func (p *tcpPool) exchange(ctx context.Context, wire []byte, q dns.Question, deadline time.Time) (*dns.Msg, error) {
	if c := p.get(); c != nil {
		m, sent, err := p.exchangeOn(ctx, c, wire, q, deadline)
		if sent || err == nil {
			return m, err
		}
	}
	d := net.Dialer{Deadline: deadline}
	c, err := d.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	m, _, err := p.exchangeOn(ctx, c, wire, q, deadline)
	return m, err
}

// exchangeOn runs one exchange on c and returns c to the pool if it went
// well. sent reports whether any reply bytes arrived: if none did on a reused
// connection, it is safe to try again.
func (p *tcpPool) exchangeOn(ctx context.Context, c net.Conn, wire []byte, q dns.Question, deadline time.Time) (m *dns.Msg, sent bool, err error) {
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	c.SetDeadline(deadline)

	id := uint16(rand.Uint32())
	out := make([]byte, 2+len(wire))
	binary.BigEndian.PutUint16(out, uint16(len(wire)))
	copy(out[2:], wire)
	binary.BigEndian.PutUint16(out[2:], id)
	if _, err := c.Write(out); err != nil {
		c.Close()
		return nil, false, err
	}
	// Read until the reply that answers this query; anything else on the
	// stream (a stray duplicate, a wrong ID, garbage) is skipped, as over UDP.
	for {
		var lenBuf [2]byte
		if _, err := io.ReadFull(c, lenBuf[:]); err != nil {
			c.Close()
			return nil, sent, p.timeoutOr(ctx, err)
		}
		sent = true
		buf := make([]byte, binary.BigEndian.Uint16(lenBuf[:]))
		if _, err := io.ReadFull(c, buf); err != nil {
			c.Close()
			return nil, sent, p.timeoutOr(ctx, err)
		}
		m = new(dns.Msg)
		if m.Unpack(buf) == nil && answers(m, id, q) {
			p.put(c)
			return m, sent, nil
		}
	}
}

// timeoutOr names a deadline error for what it is.
func (p *tcpPool) timeoutOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return ErrTimeout
	}
	return err
}
