package upstream

import (
	"encoding/binary"
	"errors"
	"sync/atomic"
	"time"

	"dnsproxi/internal/wire"
)

// DNS 0x20: each UDP query goes out with the case of its name's letters
// drawn at random, one bit of entropy per letter, and a reply must carry
// the question back byte for byte. An off-path spoofer must then guess the
// case as well as the ID and the port. A name without letters carries no
// such bit; it is compared as it is.
//
// Some resolvers answer with the name in a case of their own. A reply whose
// question differs from what was sent only in case ("case changed") never
// answers a query while 0x20 is on; the query keeps waiting. Such a reply
// is either forged by someone who guessed the ID, or the upstream does not
// echo case, and the proxy must tell the two apart without handing a
// spoofer the power to switch 0x20 off:
//
//   - A case change is evidence of nothing by itself. It makes the query a
//     suspect and starts a probe, if none is out: the upstream sends the
//     same question itself, under a fresh ID and a fresh random case.
//   - A probe whose reply comes back exact proves the upstream echoes case:
//     the count starts again. One whose reply comes back case-changed counts
//     one, and the next probe goes out at once; a probe that times out
//     proves nothing and ends the series.
//   - caseProbes probes in a row answered case-changed switch 0x20 off for
//     this upstream for the rest of the process, and every suspect query is
//     sent again in the caller's case, within its deadline.
//
// Why a spoofer cannot fake that evidence cheaply: one probe is out at a
// time, so a flood of forged replies over many queries in flight (the
// birthday attack) gains nothing; the spoofer must hit the one ID of each
// probe in turn, on its port, before the real upstream's exact reply
// arrives, caseProbes times in a row: some 2^16 forged packets per probe
// and port in use even for a spoofer who knows the ports, 2^32 for one who
// does not. A single forged reply, or any number spread over queries the
// real upstream answers, switches nothing off. (A spoofer on the path sees
// the probes and can; it can as well forge the answers themselves.)
//
// A real upstream that does not echo case answers every probe
// case-changed, from its cache, in one round trip each: the first query
// pays caseProbes+1 extra round trips (the probes, then itself again), the
// queries after it nothing.

// caseProbes is how many probes in a row must come back case-changed.
const caseProbes = 3

// errCaseChanged ends a probe whose reply came back in another case.
var errCaseChanged = errors.New("upstream: reply's question in another case")

// verdict is what a reply is to the query waiting under its ID.
type verdict int

const (
	replyForeign     verdict = iota // not an answer to it: another question, not a reply
	replyAnswers                    // its answer
	replyCaseChanged                // its question, with the case of some letters changed: not its answer while 0x20 is on
)

// caseCheck is an upstream's 0x20 state: whether it is on, the probe
// series, and the counts Stats reports.
type caseCheck struct {
	plain      atomic.Bool  // 0x20 off: the upstream does not echo case
	probing    atomic.Bool  // a probe series is under way (or 0x20 is off: no more)
	changed    atomic.Int32 // probes in a row answered case-changed; touched by one probe at a time
	mismatches atomic.Uint64
	probes     atomic.Uint64
	resends    atomic.Uint64
}

// mixCase sets the case of each ASCII letter of name (the name of a question,
// in wire form) from bits of rng, and reports whether there was a letter.
// Label lengths are below 64, never a letter, so they are left as they are.
func mixCase(name []byte, rng *entropy) bool {
	var bits uint64
	n := 0 // bits left in bits
	letters := false
	for i, b := range name {
		if !isLetter(b) {
			continue
		}
		if n == 0 {
			bits, n = rng.uint64(), 64
		}
		if bits&1 != 0 {
			name[i] = b &^ 0x20 // upper case
		} else {
			name[i] = b | 0x20 // lower case
		}
		bits >>= 1
		n--
		letters = true
	}
	return letters
}

func isLetter(b byte) bool { return 'a' <= b|0x20 && b|0x20 <= 'z' }

// equalFold reports whether a and b hold the same question (name, type,
// class), folding case on the name's letters only: the type and class are
// the last four bytes, compared exactly.
func equalFold(a, b []byte) bool {
	if len(a) != len(b) || len(a) < 4 {
		return false
	}
	name := len(a) - 4
	for i := range name {
		x, y := a[i], b[i]
		if x != y && !(isLetter(x) && x^y == 0x20) {
			return false
		}
	}
	return string(a[name:]) == string(b[name:])
}

// match tells what reply is to c: the same ID, QR set, one question, and
// that question byte for byte what was sent; or, for a query sent in the
// caller's case, the same question with the name's case folded.
func (c *call) match(reply []byte) verdict {
	if len(reply) < c.qend || wire.ID(reply) != wire.ID(c.wire) || wire.Flags(reply)&wire.FlagQR == 0 {
		return replyForeign
	}
	if qd, _, _, _ := wire.Counts(reply); qd != 1 {
		return replyForeign
	}
	got, sent := reply[wire.HeaderLen:c.qend], c.wire[wire.HeaderLen:c.qend]
	switch {
	case string(got) == string(sent):
		return replyAnswers
	case !equalFold(got, sent):
		return replyForeign
	case c.mixed:
		return replyCaseChanged
	}
	return replyAnswers
}

// restoreOwners gives the caller's case back to the owner names of reply's
// records, from off on, that repeat the name as sent (mixed): upstreams
// that do not compress names copy the question's case into them. Names
// that point at the question get the caller's case with it. Anything
// malformed ends the walk; finish does the question itself.
func restoreOwners(reply []byte, off int, mixed, name []byte) {
	_, an, ns, ar := wire.Counts(reply)
	for range an + ns + ar {
		start := off
		for {
			if off >= len(reply) {
				return
			}
			l := int(reply[off])
			if l == 0 {
				off++
				break
			}
			if l&0xC0 == 0xC0 { // a pointer ends the name
				off += 2
				break
			}
			if l > 63 {
				return
			}
			off += 1 + l
		}
		if off+10 > len(reply) {
			return
		}
		if string(reply[start:off]) == string(mixed) {
			copy(reply[start:], name)
		}
		off += 10 + int(binary.BigEndian.Uint16(reply[off+8:])) // type, class, TTL, RDLENGTH, RDATA
	}
}

// probeQuery returns a copy of the query c stands for, in the caller's case,
// for a probe to ask again.
func (c *call) probeQuery() []byte {
	q := append([]byte(nil), c.wire...)
	copy(q[wire.HeaderLen:], c.name)
	return q
}

// startProbe starts a probe series with query, unless one is under way.
func (u *Upstream) startProbe(query []byte) {
	if u.cases.probing.CompareAndSwap(false, true) {
		u.sendProbe(query)
	}
}

// sendProbe sends query as a probe: its outcome goes to probeDone.
func (u *Upstream) sendProbe(query []byte) {
	qend, ok := wire.QuestionEnd(query)
	if !ok || u.closed.Load() {
		u.cases.probing.Store(false)
		return
	}
	now := time.Now()
	c := newCall(u, query, qend, u.probeDone, now, now.Add(u.cfg.Timeout))
	c.probe = true
	u.cases.probes.Add(1)
	u.sendUDP(c, now)
}

// probeDone weighs one probe's outcome: see the rules above.
func (u *Upstream) probeDone(query, _ []byte, err error) {
	switch {
	case errors.Is(err, errCaseChanged):
		if u.cases.changed.Add(1) >= caseProbes {
			u.switchToPlainCase()
			return // probing stays set: no probe ever again
		}
		u.sendProbe(query)
	default: // exact: the upstream echoes case; an error: no verdict
		u.cases.changed.Store(0)
		u.cases.probing.Store(false)
	}
}

// switchToPlainCase turns 0x20 off for good and sends the suspect queries
// again in the caller's case: they had their one reply already.
func (u *Upstream) switchToPlainCase() {
	if u.cases.plain.Swap(true) {
		return
	}
	if fn := u.cfg.OnCaseFallback; fn != nil {
		u.background(fn)
	}
	var again []*call
	for _, sl := range u.socks {
		again = sl.takeSuspects(again)
	}
	u.cases.resends.Add(uint64(len(again)))
	now := time.Now()
	for _, c := range again {
		u.sendUDP(c, now)
	}
}
