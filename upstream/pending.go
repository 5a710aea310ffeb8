package upstream

import (
	"time"

	"dnsproxi/internal/wire"
)

// maxPending keeps some IDs free so that picking a random free one stays quick.
const maxPending = 60000

// pending is the table of queries in flight on one socket or connection, by
// the ID each went out under. Whoever removes a query from it reports that
// query's outcome (or sends it again, and so files it in another table):
// that is what makes every report happen exactly once. Its owner's mutex
// guards it.
type pending map[uint16]*call

// add files c under a random free ID drawn from rng, which it writes into c.wire.
func (p pending) add(c *call, rng *entropy) error {
	if len(p) >= maxPending {
		return ErrBusy
	}
	for {
		id := uint16(rng.uint64())
		if _, taken := p[id]; !taken {
			wire.SetID(c.wire, id)
			p[id] = c
			return nil
		}
	}
}

// take removes and returns the query reply answers (or an error without a
// question, noquestion.go), if it is waiting here, with replyAnswers; or with replyLate if its deadline was before now: late
// is not in time, and the caller ends it as the sweeper would have. Anything
// else (a duplicate, spoofed, not an answer, the case changed) leaves the
// table as it was: the real answer may still come.
func (p pending) take(reply []byte, now time.Time) (*call, verdict) {
	id := wire.ID(reply)
	c := p[id]
	if c == nil {
		return nil, replyForeign
	}
	if v := c.match(reply); v != replyAnswers && v != replyBare {
		return nil, replyForeign
	}
	delete(p, id)
	if now.After(c.deadline) {
		return c, replyLate
	}
	return c, replyAnswers
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

// takeSuspects removes the queries that had a reply in another case and
// appends them to out. A probe stays: it is judged at its deadline (case.go).
func (p pending) takeSuspects(out []*call) []*call {
	for id, c := range p {
		if c.suspect && !c.probe {
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
