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

// errConnLost ends a query whose connection failed when it could not be sent again.
var errConnLost = errors.New("upstream: TCP connection lost")

// errFetchLost is errConnLost for a query fetched over TCP after its UDP
// reply came in another case (case.go): the upstream did answer it, and an
// upstream that serves UDP alone, behind a farm of which some backends fold
// case, is not sick. Judge leaves it uncounted, as the timeout such a
// query ended with before the fetch was (ErrNameTimeout): counted, half the
// queries of a UDP-only farm half of whose backends fold would open its
// breaker (TestDiffFoldingFarmWithoutTCPLeavesTheBreakerAlone).
var errFetchLost = errors.New("upstream: the reply came in another case and its fetch over TCP failed: TCP connection lost")

// tcpConns keeps a few long-lived TCP connections to the upstream and
// pipelines queries on them (RFC 7766): many in flight per connection, each
// under its own random ID, answered in any order. Names go out in the
// caller's case: an off-path spoofer cannot inject into a TCP stream, so
// 0x20 would add nothing there but failures at upstreams that do not echo
// case. Nothing here blocks the
// caller: a connection that must be dialled first is dialled on a goroutine
// of its own, and writes go out from each connection's writer.
//
// A connection can go bad without closing: the upstream reads and answers
// nothing, or stops half-way through a reply. New queries go to the least
// busy connection, and one whose queries all expire looks empty, so it would
// take every query until it idled out. The sweeper watches for that: a
// connection on which a query reaches its deadline, that query having been
// sent after the connection last delivered a reply (or opened), had the
// query's whole time to deliver something and delivered nothing. It is
// failed (tcpConn.fail): it takes no more queries, and the ones it carries
// go out on another. Only a reply to a query waiting on it counts as life:
// frames too short, for no waiting query, or duplicates renew neither this
// nor the idle deadline, so a stream of them cannot keep a connection on.
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
	tc := &tcpConn{p: p, pending: make(pending), wake: make(chan struct{}, 1), quietSince: time.Now()}
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

// takeExpired removes the queries whose deadline is before now, and fails
// each connection found stalled by one of them.
func (p *tcpConns) takeExpired(now time.Time, out []*call) []*call {
	p.mu.Lock()
	slots := p.slots
	p.mu.Unlock()
	for _, tc := range slots {
		if tc == nil {
			continue
		}
		var stalled bool
		if out, stalled = tc.takeExpired(now, out); stalled {
			tc.fail(ErrTimeout)
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

	mu         sync.Mutex
	pending    pending
	rng        entropy   // IDs
	out        []byte    // length-prefixed frames waiting for the writer
	quietSince time.Time // when it last delivered a reply to a waiting query, or opened
	answered   bool      // it has delivered a reply to a waiting query
	dead       bool
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

// read hands each reply to its query until the connection fails, or
// delivers no reply for the idle time.
func (tc *tcpConn) read() {
	defer tc.p.wg.Done()
	buf := make([]byte, 65535)
	var lenBuf [2]byte
	lastReply := time.Now()
	for {
		tc.conn.SetReadDeadline(lastReply.Add(tc.p.idle))
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
		if c != nil { // late or not, the connection is delivering
			tc.quietSince, tc.answered, lastReply = now, true, now
		}
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

// fail closes the connection and takes its queries out. While a query has
// time left, it goes out again on another connection: if this connection
// delivered a reply (RFC 7766 lets an upstream close a connection at any
// time, and one may answer a single query per connection), as long as the
// query may go out at all (maxSends, extra.go); once, if it delivered none
// (it may have closed an idle connection as the query went out), so that
// an upstream that accepts and closes is not dialled again and again. Each
// such send is paid through Config.AllowExtra, and a query it refuses ends
// with ErrLimited. A failed connection sends its queries again at most
// once, only one that delivered a reply can send a query a second time,
// and no query goes out more than maxSends times: the upstream reads at
// most maxSends times the queries forwarded, and the connections opened
// again are bounded by the replies the upstream gave and the queries
// (tcpSlots for each at most), not by the time left. The other queries end
// with err if it is ErrClosed, else with errConnLost.
func (tc *tcpConn) fail(err error) {
	tc.mu.Lock()
	if tc.dead {
		tc.mu.Unlock()
		return
	}
	tc.dead = true
	left := tc.pending.takeAll(nil)
	conn, answered := tc.conn, tc.answered
	tc.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
	tc.signal() // lets the writer see it is dead
	now := time.Now()
	for _, c := range left {
		switch {
		case errors.Is(err, ErrClosed):
			c.finish(nil, ErrClosed)
		case c.retried && !answered, !now.Before(c.deadline):
			c.finish(nil, errConnLost)
		default:
			switch again := tc.p.u.extraSend(c); {
			case errors.Is(again, ErrLimited):
				c.finish(nil, ErrLimited)
			case again != nil: // sent as often as a query may be
				c.finish(nil, errConnLost)
			default:
				c.retried = c.retried || !answered
				tc.p.send(c)
			}
		}
	}
}

// takeExpired removes the queries whose deadline is before now and appends
// them to out. stalled reports that one of them was sent after the
// connection last delivered a reply, or opened. A query sent before that
// does not judge it: the connection delivered while it waited, or the query
// spent part of its time elsewhere (on a connection that failed, or before
// this one opened).
func (tc *tcpConn) takeExpired(now time.Time, out []*call) (_ []*call, stalled bool) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	n := len(out)
	out = tc.pending.takeExpired(now, out)
	for _, c := range out[n:] {
		if c.sent.After(tc.quietSince) {
			return out, true
		}
	}
	return out, false
}

// timeoutOr names a deadline error for what it is.
func timeoutOr(err error) error {
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return ErrTimeout
	}
	return err
}
