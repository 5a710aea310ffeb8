// Package upstream is the client side of the proxy: it forwards a query to
// one upstream resolver and hands back only a reply that answers it.
//
// Every query goes out under a fresh random message ID; a reply is accepted
// only if its ID, QR bit and question (name, type, class) match what was
// sent, and anything else is ignored while the query keeps waiting until its
// deadline, so a stray or spoofed datagram never reaches the client. UDP
// queries share a fixed set of long-lived sockets, each on its own source
// port, read and written in batches and demultiplexed by ID; a UDP reply
// with TC set is fetched again over TCP. Over TCP, a few long-lived
// connections carry many queries each, pipelined, and close when idle.
//
// Forward never blocks. It reports the outcome of every query exactly once,
// to the Result it was given: the reply, or why there is none (a deadline
// passed, the network failed, the upstream was closed). Whoever takes a
// query out of the table of queries in flight — the reader with its reply,
// the sweeper at its deadline, Close — is the one that reports it.
package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// Defaults for Config's zero fields.
const (
	DefaultTimeout    = 2 * time.Second
	DefaultUDPSockets = 8
	DefaultTCPIdle    = 10 * time.Second
)

// Errors a query can end with; callers use errors.Is.
var (
	ErrTimeout = errors.New("upstream: no valid reply before the deadline")
	ErrBusy    = errors.New("upstream: no free message ID on the socket")
	ErrNoQuery = errors.New("upstream: query has no question to match a reply against")
	ErrClosed  = errors.New("upstream: closed")
)

// Result receives the outcome of one query, exactly once: query is the
// query as the client sent it, reply the upstream's answer with the client's
// ID (nil with an error). Both are only valid until Result returns.
type Result func(query, reply []byte, err error)

// Config sets where and how to forward. A zero field takes its default.
type Config struct {
	Addr       string        // upstream host:port
	Timeout    time.Duration // deadline of one query, TC retry included (default 2s)
	UDPSockets int           // long-lived UDP sockets, each its own source port (default 8)
	TCPIdle    time.Duration // a TCP connection with nothing to read for this long is closed (default 10s)
}

// Upstream forwards queries to one resolver. It is safe for concurrent use.
type Upstream struct {
	cfg   Config
	raddr *net.UDPAddr
	socks []*udpSocket
	next  atomic.Uint32 // round-robin over socks
	tcp   *tcpConns

	stopSweep chan struct{}
	sweeper   sync.WaitGroup
	closed    atomic.Bool

	// answered is when a valid reply was last taken, as time since epoch
	// (monotonic); the sweeper reads it to judge a timeout (result.go).
	// Every reader writes it, so it sits on a cache line of its own.
	epoch    time.Time
	_        [64]byte
	answered atomic.Int64
	_        [56]byte
}

// New resolves cfg.Addr once and opens the UDP sockets.
func New(cfg Config) (*Upstream, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.UDPSockets <= 0 {
		cfg.UDPSockets = DefaultUDPSockets
	}
	if cfg.TCPIdle <= 0 {
		cfg.TCPIdle = DefaultTCPIdle
	}
	raddr, err := net.ResolveUDPAddr("udp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("upstream %q: %w", cfg.Addr, err)
	}
	u := &Upstream{cfg: cfg, raddr: raddr, stopSweep: make(chan struct{}), epoch: time.Now()}
	u.tcp = newTCPConns(u, raddr.String(), cfg.TCPIdle)
	for range cfg.UDPSockets {
		s, err := dialUDP(u, raddr)
		if err != nil {
			u.Close()
			return nil, fmt.Errorf("upstream %q: %w", cfg.Addr, err)
		}
		u.socks = append(u.socks, s)
	}
	u.sweeper.Add(1)
	go u.sweep()
	return u, nil
}

// Close closes every socket. Queries still waiting end with ErrClosed.
func (u *Upstream) Close() error {
	if u.closed.Swap(true) {
		return nil
	}
	close(u.stopSweep)
	u.sweeper.Wait()
	for _, s := range u.socks {
		s.close()
	}
	u.tcp.close()
	return nil
}

// Forward sends query (a packet with one question) over network ("udp" or
// "tcp") and reports the outcome to done, exactly once, later or before it
// returns. Over UDP a truncated reply is fetched again over TCP. query is
// copied: the caller may reuse it once Forward returns.
func (u *Upstream) Forward(query []byte, network string, done Result) {
	qend, ok := wire.QuestionEnd(query)
	if !ok {
		done(query, nil, ErrNoQuery)
		return
	}
	if u.closed.Load() {
		done(query, nil, ErrClosed)
		return
	}
	c := newCall(u, query, qend, done, time.Now().Add(u.cfg.Timeout))
	if network == "tcp" {
		u.forwardTCP(c)
		return
	}
	s := u.socks[int(u.next.Add(1))%len(u.socks)]
	if err := s.send(c); err != nil {
		c.finish(nil, err)
	}
}

// forwardTCP sends the query over one of the pipelined TCP connections.
func (u *Upstream) forwardTCP(c *call) { u.tcp.send(c) }

// sweep ends the queries whose deadline has passed, a few times per timeout,
// each with ErrTimeout or ErrNameTimeout (result.go).
func (u *Upstream) sweep() {
	defer u.sweeper.Done()
	every := min(max(u.cfg.Timeout/20, time.Millisecond), 100*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	var expired []*call
	for {
		select {
		case <-u.stopSweep:
			return
		case now := <-t.C:
			expired = expired[:0]
			for _, s := range u.socks {
				expired = s.takeExpired(now, expired)
			}
			expired = u.tcp.takeExpired(now, expired)
			for _, c := range expired {
				c.finish(nil, u.timeoutFor(c))
			}
		}
	}
}

// Exchange sends req and waits for its answer: Forward for callers that
// want a *dns.Msg and can wait. The answer carries req's ID. If ctx ends
// first, Exchange returns ctx's error; the query itself runs to its deadline.
func (u *Upstream) Exchange(ctx context.Context, req *dns.Msg, network string) (*dns.Msg, error) {
	if len(req.Question) != 1 {
		return nil, ErrNoQuery
	}
	query, err := req.Pack()
	if err != nil {
		return nil, fmt.Errorf("upstream: packing the query: %w", err)
	}
	type outcome struct {
		m   *dns.Msg
		err error
	}
	ch := make(chan outcome, 1)
	u.Forward(query, network, func(_, reply []byte, err error) {
		if err != nil {
			ch <- outcome{nil, err}
			return
		}
		m := new(dns.Msg)
		if err := m.Unpack(reply); err != nil {
			ch <- outcome{nil, err}
			return
		}
		ch <- outcome{m, nil}
	})
	select {
	case o := <-ch:
		return o.m, o.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// call is one query in flight.
type call struct {
	u        *Upstream
	wire     []byte // the query as sent, under the upstream ID while it is out
	clientID uint16
	qend     int // wire[12:qend] is the question
	deadline time.Time
	done     Result
	retried  bool // sent again after its TCP connection failed
}

var calls = sync.Pool{New: func() any { return new(call) }}

func newCall(u *Upstream, query []byte, qend int, done Result, deadline time.Time) *call {
	c := calls.Get().(*call)
	c.u = u
	c.wire = append(c.wire[:0], query...)
	c.clientID, c.qend, c.deadline, c.done, c.retried = wire.ID(query), qend, deadline, done, false
	return c
}

// finish reports the outcome and recycles the call. reply, if any, gets the
// client's ID. Only the one who took c out of the table calls it.
func (c *call) finish(reply []byte, err error) {
	wire.SetID(c.wire, c.clientID)
	if reply != nil {
		c.u.markAnswered() // before done: the upstream answered in time
		wire.SetID(reply, c.clientID)
	}
	c.done(c.wire, reply, err)
	c.done = nil
	calls.Put(c)
}

// answers reports whether reply answers the query c sent: the same ID, QR
// set, one question, and that question the same as the query's.
func (c *call) answers(reply []byte) bool {
	if len(reply) < c.qend || wire.ID(reply) != wire.ID(c.wire) || wire.Flags(reply)&wire.FlagQR == 0 {
		return false
	}
	qd, _, _, _ := wire.Counts(reply)
	return qd == 1 && wire.EqualQuestion(reply[wire.HeaderLen:c.qend], c.wire[wire.HeaderLen:c.qend])
}
