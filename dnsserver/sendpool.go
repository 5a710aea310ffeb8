package dnsserver

import (
	"sync/atomic"

	"github.com/miekg/dns"
)

// The answers queued on a TCP connection are bounded in bytes so that a
// client that stops reading cannot make the server hold unbounded memory.
// The bound must judge the reader, not the burst: a client that pipelines
// queries with large answers (DNSSEC, big TXT) and reads as fast as it can
// still has them complete together, from an upstream's one read or from
// one flight its queries were coalesced on, before its writer had any
// chance to write. So a connection's queue has two parts:
//
//   - its share, sendShareBytes, which it may always fill: room for two of
//     the largest answers, whatever the other connections hold;
//   - beyond it, up to sendQueueBytes in all, bytes borrowed from one pool
//     the server's connections share (Server.TCPBurstBytes), given back as
//     the writer writes them or as the connection closes.
//
// An answer for which neither has room closes the connection
// ("tcp_slow_reader"). A client that does not read is closed by the same
// bound, or by its writer's deadline, whichever comes first; one that reads
// holds borrowed bytes only until its writer has handed them to the kernel.
// So the answers queued on TCP never exceed
// MaxTCPConns × sendShareBytes + TCPBurstBytes, and on one connection
// sendQueueBytes (or TCPPipeline of the largest answers, if fewer).
//
// The pool is first come, first served: clients that burst without reading
// can hold it for up to a write deadline each (then they are closed), and a
// burst beyond its share that finds it empty meanwhile is closed, as every
// such burst was before the pool. Answers within a connection's share never
// depend on the pool.

// sendShareBytes is what a connection may always queue: two of the largest
// answers with their length prefixes, the write under way included.
const sendShareBytes = 2 * (2 + dns.MaxMsgSize)

// sendQueueBytes bounds what one connection may queue, its share and what
// it borrows: sixteen of the largest answers (1 MiB), seventeen of 60 KB.
const sendQueueBytes = 16 * (2 + dns.MaxMsgSize)

// DefaultTCPBurstBytes is the default Server.TCPBurstBytes: four
// connections' full queues beyond their shares, or sixty-eight bursts of
// three 60 KB answers at once.
const DefaultTCPBurstBytes = 4 << 20

// burstPool is the bytes the connections may borrow beyond their shares.
// It never lends more than it holds: free never goes below zero.
type burstPool struct {
	free atomic.Int64
}

// take borrows n bytes and reports whether there were that many free.
func (p *burstPool) take(n int) bool {
	for {
		free := p.free.Load()
		if free < int64(n) {
			return false
		}
		if p.free.CompareAndSwap(free, free-int64(n)) {
			return true
		}
	}
}

// give returns n bytes taken before.
func (p *burstPool) give(n int) {
	p.free.Add(int64(n))
}

// reserve makes room in cc's queue for n more bytes: within its share at
// once, beyond it with bytes borrowed from the server's pool, never beyond
// sendQueueBytes. It reports false, changing nothing, when there is no room.
// It requires that cc.mu is held.
func (cc *clientConn) reserve(n int) bool {
	after := cc.queued + n
	if after > sendQueueBytes {
		return false
	}
	need := after - sendShareBytes - cc.borrowed
	if need <= 0 {
		return true
	}
	if !cc.s.burst.take(need) {
		return false
	}
	cc.borrowed += need
	return true
}

// settle gives back to the pool what cc borrowed beyond what its queue
// holds over its share now. It requires that cc.mu is held.
func (cc *clientConn) settle() {
	over := max(cc.queued-sendShareBytes, 0)
	if extra := cc.borrowed - over; extra > 0 {
		cc.s.burst.give(extra)
		cc.borrowed = over
	}
}
