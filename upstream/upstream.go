// Package upstream is the client side of the proxy: it forwards a query to
// one upstream resolver and hands back only a reply that answers it.
//
// An off-path spoofer must guess everything RFC 5452 asks a resolver to
// randomise: every query goes out under a fresh message ID and every UDP
// query from a random source port, both from a cryptographic generator, and
// the letters of a UDP query's name in a random case (DNS 0x20). A reply is
// accepted only if its ID, QR bit and question (name, type, class) match
// what was sent byte for byte (or it is an error that names no question,
// under the query's ID: noquestion.go), and anything else is ignored while
// the query keeps waiting until its deadline, so a stray or spoofed
// datagram never reaches the client. The caller gets its own ID and its own case back.
//
// UDP queries share a few sockets, read and written in batches and
// demultiplexed by ID; each socket serves a bounded number of queries and
// time, then a fresh socket on a fresh random port takes its place. A UDP
// reply with TC set is handed back as it is (the proxy relays it and its
// client comes back over TCP); only a datagram too large to read whole, or
// a reply in another case from an upstream known to echo case (case.go),
// has its query fetched again over TCP. Over TCP, a few long-lived
// connections carry many queries each, pipelined, and close when idle, or
// when one lets a query's whole time pass without delivering any reply
// (tcpConns).
//
// Forward never blocks. It reports the outcome of every query exactly once,
// to the Result it was given: the reply, or why there is none (a deadline
// passed, the network failed, the upstream was closed). Whoever takes a
// query out of the table of queries in flight — the reader with its reply
// (or with the timeout, the reply being late), the sweeper at its deadline,
// Close — is the one that reports it, or sends it again and so files it in
// another table.
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

	"dnsproxi/internal/batchio"
	"dnsproxi/internal/wire"
)

// Defaults for Config's zero fields. udpSlot says why sockets rotate at
// these bounds.
const (
	DefaultTimeout        = 2 * time.Second
	DefaultUDPSockets     = 8
	DefaultSocketQueries  = 10000
	DefaultSocketLifetime = time.Minute
	DefaultTCPIdle        = 10 * time.Second
)

// Errors a query can end with; callers use errors.Is.
var (
	ErrTimeout = errors.New("upstream: no valid reply before the deadline")
	ErrBusy    = errors.New("upstream: no free message ID on the socket")
	ErrNoQuery = errors.New("upstream: query has no question to match a reply against")
	ErrClosed  = errors.New("upstream: closed")
	// ErrLimited ends a query the upstream would have sent again on its
	// own (extra.go) when Config.AllowExtra refused: it was not sent.
	ErrLimited = errors.New("upstream: the outbound limit refused to send the query again")
)

// Result receives the outcome of one query, exactly once: query is the
// query as the client sent it, reply the upstream's answer with the client's
// ID and its question in the client's case (nil with an error). Both are
// only valid until Result returns.
type Result func(query, reply []byte, err error)

// ResultAt is a Result that is also told when the outcome was known: now is
// a reading of the real clock, the one a reply's batch was read under (or
// the sweeper's tick, for a timeout), so a caller that needs the time of
// the outcome does not read the clock again for each query.
type ResultAt func(now time.Time, query, reply []byte, err error)

// Config sets where and how to forward. A zero field takes its default.
type Config struct {
	Addr    string        // upstream host:port
	Timeout time.Duration // deadline of one query, TCP retry and 0x20 re-send included (default 2s)

	UDPSockets     int           // UDP sockets open at a time, each on its own random source port (default 8)
	SocketQueries  int           // a UDP socket retires after this many queries (default 10,000)...
	SocketLifetime time.Duration // ...or this long, whichever comes first (default 1m)
	// AvoidPorts are never drawn as source ports: the process's own
	// listening ports, which a source port taken first would keep from binding.
	AvoidPorts []uint16

	// Disable0x20 sends UDP queries with the name in the caller's case and
	// compares a reply's name without regard to case. By default each
	// letter's case is random and a reply must echo it exactly; an upstream
	// found not to echo case is switched to the caller's case by itself.
	Disable0x20 bool
	// OnCaseFallback, if set, is called once, on a goroutine of its own,
	// when this upstream is found not to echo case and 0x20 is switched
	// off for it for the rest of the process (Stats().PlainCase).
	OnCaseFallback func()

	TCPIdle time.Duration // a TCP connection that delivers no reply for this long is closed (default 10s)

	// AllowExtra, if set, is asked right before each query the upstream
	// puts on the wire beyond the one send Forward was asked for: a query
	// sent again on a new TCP connection, the fetch over TCP of a UDP reply
	// too large to read or in another case from an upstream known to echo
	// case, a query sent again in the caller's case once 0x20 is off, a
	// 0x20 probe. The caller pays its outbound limit with it.
	// false: that query is not sent; it ends with ErrLimited (a probe
	// series ends). It runs on the upstream's own goroutines, no lock held,
	// and must not block. nil: every such send goes out.
	AllowExtra func() bool

	// Replies, if set, is held while a UDP socket's reader hands a batch of
	// replies to their queries: the writers the answers to those queries
	// go out through, so that they leave together.
	Replies *batchio.Group
	// Queries, if set, gets each UDP socket's writer while the socket is
	// open: whoever forwards a batch of queries holds it, so that they
	// leave in one system call a socket.
	Queries *batchio.Group
}

// Stats counts what the upstream's defences against spoofing have seen
// since New.
type Stats struct {
	CaseMismatches uint64 // replies with a waiting query's ID whose question came back in another case: ignored
	CaseProbes     uint64 // queries sent by the upstream itself to learn whether it echoes case
	CaseResends    uint64 // queries sent again in the caller's case, their reply having come in another case before 0x20 was switched off
	CaseFetches    uint64 // queries fetched over TCP, their reply having come in another case from an upstream known to echo case
	PlainCase      bool   // 0x20 is off: the upstream was found not to echo case
	Rotations      uint64 // UDP sockets replaced by a fresh one on a fresh random port
	RotationErrors uint64 // replacements that could not be opened (the old socket served on)
}

// Upstream forwards queries to one resolver. It is safe for concurrent use.
type Upstream struct {
	cfg   Config
	raddr *net.UDPAddr
	socks []*udpSlot    // the UDP sockets, each replaced in its slot over time
	next  atomic.Uint32 // round-robin over socks
	tcp   *tcpConns
	cases caseCheck

	rotations, rotationErrors atomic.Uint64

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
	bgMu     sync.Mutex
	bg       sync.WaitGroup // callbacks on goroutines of their own
	bgClosed bool
}

// New resolves cfg.Addr once and opens the UDP sockets.
func New(cfg Config) (*Upstream, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.UDPSockets <= 0 {
		cfg.UDPSockets = DefaultUDPSockets
	}
	if cfg.SocketQueries <= 0 {
		cfg.SocketQueries = DefaultSocketQueries
	}
	if cfg.SocketLifetime <= 0 {
		cfg.SocketLifetime = DefaultSocketLifetime
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
	u.cases.plain.Store(cfg.Disable0x20)
	now := time.Now()
	for range cfg.UDPSockets {
		s, err := dialUDP(u, raddr, now)
		if err != nil {
			for _, sl := range u.socks {
				sl.close()
			}
			return nil, fmt.Errorf("upstream %q: %w", cfg.Addr, err)
		}
		u.socks = append(u.socks, newUDPSlot(u, s))
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
	for _, sl := range u.socks {
		sl.close()
	}
	u.tcp.close()
	u.bgMu.Lock()
	u.bgClosed = true
	u.bgMu.Unlock()
	u.bg.Wait()
	return nil
}

// Stats returns the counts since New.
func (u *Upstream) Stats() Stats {
	return Stats{
		CaseMismatches: u.cases.mismatches.Load(),
		CaseProbes:     u.cases.probes.Load(),
		CaseResends:    u.cases.resends.Load(),
		CaseFetches:    u.cases.fetches.Load(),
		PlainCase:      u.cases.plain.Load() && !u.cfg.Disable0x20,
		Rotations:      u.rotations.Load(),
		RotationErrors: u.rotationErrors.Load(),
	}
}

// background runs fn on a goroutine of its own that Close waits for, unless
// Close has begun.
func (u *Upstream) background(fn func()) {
	u.bgMu.Lock()
	defer u.bgMu.Unlock()
	if !u.bgClosed {
		u.bg.Go(fn)
	}
}

// Forward sends query (a packet with one question) over network ("udp" or
// "tcp") and reports the outcome to done, exactly once, later or before it
// returns. Over UDP a reply with TC set is reported as it is. query is
// copied: the caller may reuse it once Forward returns. The query's
// deadline is Config.Timeout from now.
func (u *Upstream) Forward(query []byte, network string, done Result) {
	u.forward(time.Now(), query, network, time.Time{}, done, nil)
}

// ForwardUntil is Forward with the caller's deadline: a caller that has
// spent part of a query's time elsewhere gives what is left. A deadline
// later than Config.Timeout from now is cut to it.
func (u *Upstream) ForwardUntil(query []byte, network string, deadline time.Time, done Result) {
	u.forward(time.Now(), query, network, deadline, done, nil)
}

// ForwardAt is ForwardUntil for a caller that has just read the real clock
// (as a query came in, say): now is that reading, and stands for the one
// ForwardUntil would take — what Config.Timeout and a timeout's verdict
// count from. done hears the outcome with a reading of its own (ResultAt).
// One reading a query on the way out, one a batch of replies on the way
// back: on a VM a reading costs some 60 ns, and the pool, the upstream and
// the completion each took one of their own.
func (u *Upstream) ForwardAt(now time.Time, query []byte, network string, deadline time.Time, done ResultAt) {
	u.forward(now, query, network, deadline, nil, done)
}

// forward is Forward, ForwardUntil and ForwardAt; a zero deadline is
// Timeout from now. Exactly one of done and doneAt is set.
func (u *Upstream) forward(now time.Time, query []byte, network string, deadline time.Time, done Result, doneAt ResultAt) {
	qend, ok := wire.QuestionEnd(query)
	if !ok || u.closed.Load() {
		err := ErrNoQuery
		if ok {
			err = ErrClosed
		}
		if doneAt != nil {
			doneAt(now, query, nil, err)
		} else {
			done(query, nil, err)
		}
		return
	}
	if latest := now.Add(u.cfg.Timeout); deadline.IsZero() || deadline.After(latest) {
		deadline = latest
	}
	c := newCall(u, query, qend, done, now, deadline)
	c.doneAt = doneAt
	if network == "tcp" {
		u.forwardTCP(c)
		return
	}
	u.sendUDP(c, now)
}

// sendUDP sends c on the next UDP socket, or reports why it cannot.
func (u *Upstream) sendUDP(c *call, now time.Time) {
	sl := u.socks[u.next.Add(1)%uint32(len(u.socks))] // unsigned: never negative, on 32 bits too
	mix := !u.cases.plain.Load()
	for range 4 { // a socket retired since it was loaded: its successor is in place
		s := sl.cur.Load()
		rotate, err := s.send(c, mix, now)
		if rotate {
			sl.rotate(s, now)
		}
		if errors.Is(err, errRetired) {
			continue
		}
		if err != nil {
			c.finishAt(now, nil, err)
		}
		return
	}
	c.finishAt(now, nil, ErrBusy)
}

// forwardTCP sends the query over one of the pipelined TCP connections.
func (u *Upstream) forwardTCP(c *call) { u.tcp.send(c) }

// sweep ends the queries whose deadline has passed, a few times per timeout,
// each with the error pastDeadline gives it (result.go), and starts a new
// period of quickest replies (probe.go) now and then.
func (u *Upstream) sweep() {
	defer u.sweeper.Done()
	t := time.NewTicker(sweepEvery(u.cfg.Timeout))
	defer t.Stop()
	var expired []*call
	lastRoll := time.Now()
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
				c.finishAt(now, nil, u.pastDeadline(c))
			}
			if now.Sub(lastRoll) >= quickestPeriod {
				u.cases.quickest.roll()
				u.cases.folded.roll()
				lastRoll = now
			}
		}
	}
}

// sweepEvery is the sweeper's period for an upstream timeout: a few sweeps
// a timeout, within 1 ms to 100 ms.
func sweepEvery(timeout time.Duration) time.Duration {
	return min(max(timeout/20, time.Millisecond), 100*time.Millisecond)
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
	wire     []byte // the query as sent, under the upstream ID and case while it is out
	name     []byte // the question's name as the caller wrote it
	clientID uint16
	qend     int       // wire[12:qend] is the question
	sent     time.Time // when Forward took it: what a timeout is judged from (result.go)
	deadline time.Time
	lastSent time.Time // when it last went out over UDP: an exact reply's time is measured from it
	done     Result
	doneAt   ResultAt // instead of done, for ForwardAt
	sends    int      // times it went out or is going out, the caller's send included: maxSends at most (extra.go)
	retried  bool     // sent again after a TCP connection that delivered no reply failed
	mixed    bool     // the name went out in a random case (0x20): a reply must echo it
	suspect  bool     // a reply in another case came for this send
	probe    bool     // asked by the upstream itself, to learn whether it echoes case
	fetched  bool     // fetched over TCP after a reply in another case (case.go)
}

var calls = sync.Pool{New: func() any { return new(call) }}

func newCall(u *Upstream, query []byte, qend int, done Result, sent, deadline time.Time) *call {
	c := calls.Get().(*call)
	c.u = u
	c.wire = append(c.wire[:0], query...)
	c.name = append(c.name[:0], query[wire.HeaderLen:qend-4]...)
	c.clientID, c.qend, c.sent, c.deadline, c.done, c.doneAt = wire.ID(query), qend, sent, deadline, done, nil
	c.lastSent = time.Time{}
	c.sends = 1
	c.retried, c.mixed, c.suspect, c.probe, c.fetched = false, false, false, false, false
	return c
}

// unmix puts the name back in the caller's case, to go out that way.
func (c *call) unmix() {
	copy(c.wire[wire.HeaderLen:], c.name)
	c.mixed = false
}

// finish is finishAt for one with no clock reading at hand.
func (c *call) finish(reply []byte, err error) { c.finishAt(time.Time{}, reply, err) }

// finishAt reports the outcome, known at now (zero: the clock is read if
// the caller's ResultAt needs it), and recycles the call. The query, and
// reply if any, get the client's ID and the client's case back (in the reply: the
// question, which is the query's but for case or it would not have been
// taken, and the owner names that repeat it). Only the one who took c out
// of the table calls it; a reader hands it a reply only in time, after
// markAnswered.
func (c *call) finishAt(now time.Time, reply []byte, err error) {
	if c.fetched && errors.Is(err, errConnLost) {
		err = errFetchLost // the upstream answered it, in another case (case.go)
	}
	if reply != nil {
		if qd, _, _, _ := wire.Counts(reply); qd == 0 { // an error without a question (noquestion.go)
			reply = withQuestion(reply, c.wire[wire.HeaderLen:c.qend])
		}
		if c.mixed {
			restoreOwners(reply, c.qend, c.wire[wire.HeaderLen:wire.HeaderLen+len(c.name)], c.name)
		}
		wire.SetID(reply, c.clientID)
		copy(reply[wire.HeaderLen:], c.name)
	}
	wire.SetID(c.wire, c.clientID)
	copy(c.wire[wire.HeaderLen:], c.name)
	if c.doneAt != nil {
		if now.IsZero() {
			now = time.Now()
		}
		c.doneAt(now, c.wire, reply, err)
	} else {
		c.done(c.wire, reply, err)
	}
	c.done, c.doneAt = nil, nil
	calls.Put(c)
}
