package upstream

import (
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"dnsproxi/internal/wire"
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

// exchange sends query over a pooled or new connection and returns the
// reply. A pooled connection may have been closed by the upstream while
// idle; then the query is sent once more on a fresh one.
func (p *tcpPool) exchange(query []byte, qend int, deadline time.Time) ([]byte, error) {
	if c := p.get(); c != nil {
		reply, sent, err := p.exchangeOn(c, query, qend, deadline)
		if sent || err == nil {
			return reply, err
		}
	}
	d := net.Dialer{Deadline: deadline}
	c, err := d.Dial("tcp", p.addr)
	if err != nil {
		return nil, timeoutOr(err)
	}
	reply, _, err := p.exchangeOn(c, query, qend, deadline)
	return reply, err
}

// exchangeOn runs one exchange on c under a fresh random ID and returns c to
// the pool if it went well. sent reports whether any reply bytes arrived: if
// none did on a reused connection, it is safe to try again.
func (p *tcpPool) exchangeOn(c net.Conn, query []byte, qend int, deadline time.Time) (reply []byte, sent bool, err error) {
	c.SetDeadline(deadline)
	out := make([]byte, 2+len(query))
	binary.BigEndian.PutUint16(out, uint16(len(query)))
	copy(out[2:], query)
	wire.SetID(out[2:], uint16(rand.Uint32()))
	if _, err := c.Write(out); err != nil {
		c.Close()
		return nil, false, err
	}
	sentQ := &call{wire: out[2:], qend: qend}
	// Read until the reply that answers this query; anything else on the
	// stream (a stray duplicate, a wrong ID, garbage) is skipped, as over UDP.
	for {
		var lenBuf [2]byte
		if _, err := io.ReadFull(c, lenBuf[:]); err != nil {
			c.Close()
			return nil, sent, timeoutOr(err)
		}
		sent = true
		buf := make([]byte, binary.BigEndian.Uint16(lenBuf[:]))
		if _, err := io.ReadFull(c, buf); err != nil {
			c.Close()
			return nil, sent, timeoutOr(err)
		}
		if sentQ.answers(buf) {
			p.put(c)
			return buf, sent, nil
		}
	}
}

// timeoutOr names a deadline error for what it is.
func timeoutOr(err error) error {
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return ErrTimeout
	}
	return err
}
