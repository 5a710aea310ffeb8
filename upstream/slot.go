package upstream

import (
	"sync"
	"sync/atomic"
	"time"
)

// udpSlot is one of the upstream's UDP sockets, over time. It holds one
// socket that takes queries; when that socket reaches a bound
// (Config.SocketQueries, Config.SocketLifetime), the query that reached it
// opens a successor on a fresh random port, and the old socket retires: it
// takes no new query, reads until every query it carries is answered or
// expired, then closes.
//
// Why rotate: RFC 5452 asks for the source port to be as unpredictable as
// the ID, and a port held for the life of the process, once learned (by a
// side channel such as the kernel's ICMP rate limit, or by anyone who saw
// a query go by), stays useful to a spoofer for good. With rotation a port
// learned is good for at most 10,000 queries and one minute by default,
// and one upstream timeout more while the socket before it drains (rotate).
// Why not a socket per query, as some resolvers do: batched reads and
// writes need queries to share a socket. Opening and closing one costs
// about 0.4 ms here (BenchmarkSocketOpen; the opening, about 0.2 ms, on the
// goroutine of the query that reached the bound), some 40 ns a query at
// 10,000 queries a socket.
type udpSlot struct {
	u   *Upstream
	cur atomic.Pointer[udpSocket]

	mu      sync.Mutex
	retired []*udpSocket // still reading for the queries they carry
	closed  bool
}

func newUDPSlot(u *Upstream, s *udpSocket) *udpSlot {
	sl := &udpSlot{u: u}
	sl.cur.Store(s)
	return sl
}

// rotate puts a socket on a fresh random port in old's place. If none can be
// opened, old serves another term; while the socket it replaced last still
// carries queries, old serves on until those expire: a slot holds at most one retired
// socket, so an upstream holds at most two sockets a slot, what the
// descriptor reserve counts. Against an upstream that answers late or
// loses replies a retired socket stays open up to the timeout, and one
// rotation every 10,000 queries left a slot with as many retired sockets
// as terms in a timeout (TestAttackRetiredSocketsPassTheUpstreamsReserve:
// 32 descriptors for one upstream, 20 counted). A port then serves at most
// one upstream timeout past its bound. A retired socket that carries no
// more queries still counts until the sweeper closes it at its next tick:
// retired beside it, old made three sockets a slot
// (TestSlotHoldsOneRetiredSocketAtMost). old serves on until that tick; it
// is not closed here, on a query's goroutine, which may be that socket's
// own reader sending a query again (serveReplies).
func (sl *udpSlot) rotate(old *udpSocket, now time.Time) {
	if held, until := sl.retiring(); held {
		// Until the retired socket's last query expires, not a term: all
		// were sent before now. A whole term kept a port that reached its
		// count in a burst for up to a minute past its bound once the
		// traffic fell (TestPortServesAtMostOneTimeoutPastItsBound); one
		// timeout from each time it reached its bound again kept it up to
		// two (TestPortKeptTwiceServesAtMostOneTimeoutPastItsBound). One
		// drained, or holding only expired queries, is gone at the
		// sweeper's next tick.
		if !until.After(now) {
			until = now.Add(sweepEvery(sl.u.cfg.Timeout))
		}
		old.keepUntil(until)
		return
	}
	s, err := dialUDP(sl.u, sl.u.raddr, now)
	if err != nil {
		sl.u.rotationErrors.Add(1)
		old.keepUntil(now.Add(sl.u.cfg.SocketLifetime))
		return
	}
	sl.mu.Lock()
	if sl.closed {
		sl.mu.Unlock()
		s.close()
		return
	}
	sl.cur.Store(s)
	sl.retired = append(sl.retired, old)
	sl.mu.Unlock()
	old.retire() // after the successor is in place: a query turned away finds it
	sl.u.rotations.Add(1)
}

// retiring reports whether the slot holds a retired socket and, if one
// still carries a query, the latest deadline of a query those took: when
// they have drained. One that carries none is closed at the next sweep.
func (sl *udpSlot) retiring() (held bool, until time.Time) {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	for _, s := range sl.retired {
		if carrying, last := s.carrying(); carrying && last.After(until) {
			until = last
		}
	}
	return len(sl.retired) > 0, until
}

// takeExpired removes the queries whose deadline is before now from every
// socket of the slot and appends them to out. Retired sockets left with no
// query close here.
func (sl *udpSlot) takeExpired(now time.Time, out []*call) []*call {
	out, _ = sl.cur.Load().takeExpired(now, out)
	var drained []*udpSocket
	sl.mu.Lock()
	kept := sl.retired[:0]
	for _, s := range sl.retired {
		var empty bool
		if out, empty = s.takeExpired(now, out); empty {
			drained = append(drained, s)
		} else {
			kept = append(kept, s)
		}
	}
	clear(sl.retired[len(kept):])
	sl.retired = kept
	sl.mu.Unlock()
	for _, s := range drained {
		s.close()
	}
	return out
}

// takeSuspects removes the queries that had a reply in another case from
// every socket of the slot and appends them to out.
func (sl *udpSlot) takeSuspects(out []*call) []*call {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	out = sl.cur.Load().takeSuspects(out)
	for _, s := range sl.retired {
		out = s.takeSuspects(out)
	}
	return out
}

// sockets returns the slot's socket that takes queries and the retired ones.
func (sl *udpSlot) sockets() []*udpSocket {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	return append([]*udpSocket{sl.cur.Load()}, sl.retired...)
}

// close closes every socket of the slot, ending the queries still waiting.
func (sl *udpSlot) close() {
	sl.mu.Lock()
	sl.closed = true
	socks := append([]*udpSocket{sl.cur.Load()}, sl.retired...)
	sl.retired = nil
	sl.mu.Unlock()
	for _, s := range socks {
		s.close()
	}
}
