package upstream

import (
	"math/rand/v2"
	"time"

	"dnsproxi/internal/wire"
)

// maxPending keeps some IDs free so that picking a random free one stays quick.
const maxPending = 60000

// pending is the table of queries in flight on one socket or connection, by
// the ID each went out under. Whoever removes a query from it reports that
// query's outcome: that is what makes every report happen exactly once. Its
// owner's mutex guards it.
type pending map[uint16]*call

// add files c under a random free ID, which it writes into c.wire.
func (p pending) add(c *call) error {
	if len(p) >= maxPending {
		return ErrBusy
	}
	for {
		id := uint16(rand.Uint32())
		if _, taken := p[id]; !taken {
			wire.SetID(c.wire, id)
			p[id] = c
			return nil
		}
	}
}

// take removes and returns the query reply answers, if it is waiting here.
// Anything else (late, duplicate, spoofed, not an answer) leaves the table
// as it was: the real answer may still come.
func (p pending) take(reply []byte) *call {
	id := wire.ID(reply)
	c := p[id]
	if c == nil || !c.answers(reply) {
		return nil
	}
	delete(p, id)
	return c
}

// takeExpired removes the queries whose deadline is before now and appends them to out.
func (p pending) takeExpired(now time.Time, out []*call) []*call {
	for id, c := range p {
		if now.After(c.deadline) {
			delete(p, id)
			out = append(out, c)
		}
	}
	return out
}

// takeAll removes every query and appends it to out.
func (p pending) takeAll(out []*call) []*call {
	for id, c := range p {
		delete(p, id)
		out = append(out, c)
	}
	return out
}
