package upstream

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"dnsproxi/internal/wire"
)

// tcpSlots is how many TCP connections to the upstream the proxy keeps.
const tcpSlots = 4

// errConnLost ends a query whose connection failed after a retry.
var errConnLost = errors.New("upstream: TCP connection lost")

// tcpConns keeps a few long-lived TCP connections to the upstream and
// pipelines queries on them (RFC 7766): many in flight per connection, each
// under its own random ID, answered in any order. Names go out in the
// caller's case: an off-path spoofer cannot inject into a TCP stream, so
// 0x20 would add nothing there but failures at upstreams that do not echo
// case. Nothing here blocks the
// caller: a connection that must be dialled first is dialled on a goroutine
// of its own, and writes go out from each connection's writer.
type tcpConns struct {
	u    *Upstream
	addr string
	idle time.Duration

	mu     sync.Mutex
	slots  [tcpSlots]*tcpConn
	next   int
	closed bool
	wg     sync.WaitGroup // dialers, readers and writers
}

func newTCPConns(u *Upstream, addr string, idle time.Duration) *tcpConns {
	return &tcpConns{u: u, addr: addr, idle: idle}
}

// busyConn is how many queries a connection may carry before the next
// query goes to a new connection, while there is a free slot.
const busyConn = 64

// send puts c on the least busy live connection, or on a new one.
func (p *tcpConns) send(c *call) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.finish(nil, ErrClosed)
		return
	}
	var best *tcpConn
	bestLoad, free := 0, -1
	for i, tc := range p.slots {
		if tc == nil || !tc.alive() {
			if free < 0 {
				free = i
			}
			continue
		}
		if n := tc.load(); best == nil || n < bestLoad {
			best, bestLoad = tc, n
		}
	}
	if best == nil || (bestLoad >= busyConn && free >= 0) {
		best = p.dial(free)
	}
	p.mu.Unlock()
	best.send(c)
}

// dial fills slot i with a connection that takes queries at once and sends
// them once it is connected. It requires that p.mu is held.
func (p *tcpConns) dial(i int) *tcpConn {
	tc := &tcpConn{p: p, pending: make(pending), wake: make(chan struct{}, 1)}
	p.slots[i] = tc
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		d := net.Dialer{Deadline: time.Now().Add(p.u.cfg.Timeout)}
		conn, err := d.Dial("tcp", p.addr)
		if err != nil {
			tc.fail(timeoutOr(err))
			return
		}
		tc.mu.Lock()
		if tc.dead { // closed while dialling
			tc.mu.Unlock()
			conn.Close()
			return
		}
		tc.conn = conn
		tc.mu.Unlock()
		p.wg.Add(2)
		go tc.read()
		go tc.write()
		tc.signal()
	}()
	return tc
}

// takeExpired removes the queries whose deadline is before now.
func (p *tcpConns) takeExpired(now time.Time, out []*call) []*call {
	p.mu.Lock()
	slots := p.slots
	p.mu.Unlock()
	for _, tc := range slots {
		if tc != nil {
			out = tc.takeExpired(now, out)
		}
	}
	return out
}

// close ends every connection and every query on them, and waits for their goroutines.
func (p *tcpConns) close() {
	p.mu.Lock()
	p.closed = true
	slots := p.slots
	p.mu.Unlock()
	for _, tc := range slots {
		if tc != nil {
			tc.fail(ErrClosed)
		}
	}
	p.wg.Wait()
}

// tcpConn is one pipelined connection.
type tcpConn struct {
	p    *tcpConns
	conn net.Conn
	wake chan struct{} // the writer has frames to send

	mu      sync.Mutex
	pending pending
	rng     entropy // IDs
	out     []byte  // length-prefixed frames waiting for the writer
	dead    bool
}

func (tc *tcpConn) alive() bool {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return !tc.dead
}

func (tc *tcpConn) load() int {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return len(tc.pending)
}

func (tc *tcpConn) signal() {
	select {
	case tc.wake <- struct{}{}:
	default:
	}
}

// send files c under a random free ID and queues its frame.
func (tc *tcpConn) send(c *call) {
	tc.mu.Lock()
	if tc.dead {
		tc.mu.Unlock()
		tc.p.send(c) // lost the race with a failure: another connection
		return
	}
	if err := tc.pending.add(c, &tc.rng); err != nil {
		tc.mu.Unlock()
		c.finish(nil, err)
		return
	}
	tc.out = binary.BigEndian.AppendUint16(tc.out, uint16(len(c.wire)))
	tc.out = append(tc.out, c.wire...)
	tc.mu.Unlock()
	tc.signal()
}

// write sends the queued frames, all that have gathered in one write.
func (tc *tcpConn) write() {
	defer tc.p.wg.Done()
	var buf []byte
	for range tc.wake {
		tc.mu.Lock()
		buf, tc.out = tc.out, buf[:0]
		dead := tc.dead
		tc.mu.Unlock()
		if dead {
			return
		}
		if len(buf) == 0 {
			continue
		}
		tc.conn.SetWriteDeadline(time.Now().Add(tc.p.u.cfg.Timeout))
		if _, err := tc.conn.Write(buf); err != nil {
			tc.fail(err)
			return
		}
	}
}

// read hands each reply to its query until the connection fails or idles out.
func (tc *tcpConn) read() {
	defer tc.p.wg.Done()
	buf := make([]byte, 65535)
	var lenBuf [2]byte
	for {
		tc.conn.SetReadDeadline(time.Now().Add(tc.p.idle))
		if _, err := io.ReadFull(tc.conn, lenBuf[:]); err != nil {
			tc.fail(err)
			return
		}
		reply := buf[:binary.BigEndian.Uint16(lenBuf[:])]
		if _, err := io.ReadFull(tc.conn, reply); err != nil {
			tc.fail(err)
			return
		}
		if len(reply) < wire.HeaderLen {
			continue
		}
		now := time.Now() // one reading per reply: a frame is read whole, one at a time
		tc.mu.Lock()
		c, v := tc.pending.take(reply, now)
		tc.mu.Unlock()
		switch {
		case c == nil: // a stray duplicate, a wrong ID or garbage: skipped, as over UDP
		case v == replyLate:
			c.finishAt(now, nil, tc.p.u.pastDeadline(c))
		default:
			tc.p.u.markAnswered(now) // before done: the upstream answered in time
			c.finishAt(now, reply, nil)
		}
	}
}

// fail closes the connection. Its queries go once more on another
// connection if they have not been retried yet and time remains (the
// upstream may have closed an idle connection as they were sent); the
// others end with err.
func (tc *tcpConn) fail(err error) {
	tc.mu.Lock()
	if tc.dead {
		tc.mu.Unlock()
		return
	}
	tc.dead = true
	left := tc.pending.takeAll(nil)
	conn := tc.conn
	tc.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
	tc.signal() // lets the writer see it is dead
	now := time.Now()
	for _, c := range left {
		if !c.retried && now.Before(c.deadline) && !errors.Is(err, ErrClosed) {
			c.retried = true
			tc.p.send(c)
			continue
		}
		if errors.Is(err, ErrClosed) {
			c.finish(nil, ErrClosed)
		} else {
			c.finish(nil, errConnLost)
		}
	}
}

func (tc *tcpConn) takeExpired(now time.Time, out []*call) []*call {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	return tc.pending.takeExpired(now, out)
}

// timeoutOr names a deadline error for what it is.
func timeoutOr(err error) error {
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return ErrTimeout
	}
	return err
}
