package upstream

import (
	"encoding/binary"
	"errors"
	"sync/atomic"

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
// answers a query while 0x20 is on. Such a reply is either forged by
// someone who guessed the ID, or comes from a resolver that does not echo
// case: the whole upstream, or one backend of a farm behind its address
// (a load balancer over resolvers that do not all echo). The proxy must
// tell these apart without handing a spoofer the power to switch 0x20 off.
// The evidence therefore comes from questions the spoofer does not choose,
// inside windows it does not set, and the upstream's own exact reply
// outweighs any forged one:
//
//   - A case change is evidence of nothing by itself. It starts a probe
//     series, if none is under way, and the query does not take it.
//   - To a query of an upstream known to echo case (it has answered one
//     exactly, once at least: caseCheck.echoes), a case change comes from
//     a forger or from a backend that folds: the query is taken out and
//     fetched over TCP, where the handshake keeps an off-path forger out
//     and any case is taken, before the same deadline, paid like every
//     send the upstream makes on its own (extra.go), once: over TCP it
//     stays. Waiting would not do: the backend that folds sends no other
//     reply, the probes, answered exactly by the others, keep 0x20 on,
//     and every query that met it timed out (7 to 9 of 16 with half the
//     backends folding: TestFarmWithFoldingBackendsAnswersEveryQuery). A
//     forged reply is no more taken than before; its query gets the real
//     answer over TCP (TestForgedCaseChangeToAnEchoingUpstreamIsFetched).
//     Probes are never fetched: their verdict is the case.
//   - To a query of an upstream never yet answered exactly (one that folds
//     every name, or the first moments), a case change makes the query a
//     suspect, which waits for the probe series: fetching would turn each
//     query of a folding upstream's first moments into a TCP query, and
//     leave no suspect for the series to send again in the caller's case
//     (TestFoldingUpstreamIsProbedNotFetched).
//   - A probe asks a question the upstream is known to answer with the case
//     echoed, under a fresh ID and a fresh random case with letters of both
//     cases: the last question it answered exactly (each socket keeps a
//     copy), or "localhost. A" before any (RFC 6761: answered without
//     leaving the resolver). Never the suspect's question: a client picks
//     that one, and can pick a name whose authority never answers.
//   - A probe waits W: probeRTTs times the quickest exact reply of the
//     last minute or so, at least minProbeWait, at most Timeout. A mean
//     reply time would not do: a client whose zone answers just before the
//     timeout could raise it; the quickest exact reply can be neither
//     raised by slow names nor lowered by forgery (it needs the case).
//     With no exact reply known, W is probeRTTs times the quickest reply
//     in another case, from Timeout/probeWaitShare to Timeout: an upstream
//     that never echoes case never gives an exact reply, and with W held
//     at Timeout/probeWaitShare one farther away than that (250 ms against
//     the default 200) answered every probe late, each series ended as if
//     it were silent, and 0x20 was never switched off: every query with a
//     letter failed for good
//     (TestAttackDistantUpstreamThatDoesNotEchoCaseIsFoundOut). A reply in
//     another case can be forged, so it only lengthens W, never shortens
//     it below Timeout/probeWaitShare, and never counts once an exact one
//     is known: a forged quick one would end each probe before the
//     upstream's exact reply came to overrule the forger's
//     (TestAttackForgedFoldedReplySetsTheProbeWindow).
//   - At the end of W the probe is judged. An exact reply in time proves
//     the upstream echoes case, even if a case-changed one came first: the
//     series ends and 0x20 stays on. A case-changed reply in time and no
//     exact one counts one, and the next probe goes out. No reply in time
//     ends the series: silence proves nothing, and it is the one thing a
//     spoofer needs. A reply after W is late, as for any query (result.go).
//   - caseProbes probes in a row counted switch 0x20 off for this upstream
//     for the rest of the process, and every suspect query is sent again
//     in the caller's case, within its deadline. An upstream that echoed
//     case once and no longer does (another resolver behind its address)
//     is found out the same way, its queries fetched over TCP meanwhile;
//     so may a farm whose folding backends answer three probes in a row,
//     and its queries are answered either way.
//
// What a spoofer must now do. Forged replies alone switch nothing off:
// while the upstream answers the probe's question within W, its exact
// reply overrules the forged one. So the spoofer needs the upstream silent
// on that question, three probes in a row: it cannot choose the question,
// only, on an idle proxy, make its own name the last one answered exactly
// and then stop answering it, or catch the upstream down. And it must land
// a case-changed reply with each probe's ID on its port inside each W, one
// series per suspect it creates (a query of its own let through the entry
// gates, and that query's ID hit). For a spoofer who knows the port, that
// is 65,536 packets per probe to be sure: with W at its 1 ms floor (a LAN
// upstream), 65 million packets a second; at 1 million a second it hits
// one probe in 65, three in a row once in 280,000 series, some 10^9
// packets. Not knowing the port multiplies each probe's cost by 64,512.
// The wide window left: before the upstream has answered any query
// (just after start), W is Timeout/probeWaitShare, 200 ms by default; an
// upstream down at that moment lets 3 x 65,536 packets at 330,000 a
// second switch 0x20 off; and with the upstream silent, the spoofer's own
// case-changed reply to the first probe is the quickest reply there is, so
// the next probes wait up to four times as long (a silent upstream is the
// one case where a forged reply sets W; the port must still be known).
// (A spoofer on the path sees the probes and can; it can as well forge the
// answers themselves.) A forged case change to a query of an upstream
// known to echo case buys the spoofer, for the same 65,536 packets a
// query and a port, one TCP query that answers it, never an answer of its
// own choosing; with the outbound limit's tokens spent the query ends with
// ErrLimited, where it would have waited for the exact reply.
//
// A real upstream that does not echo case answers every probe
// case-changed and never exactly, so each probe waits out its W: the
// queries of the first moments pay caseProbes waits of probeRTTs round
// trips (each rounded up to the sweeper's next pass), once, and those whose
// deadline passes meanwhile fail (an upstream 250 ms away: 3 s); the
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
	replyFolded                     // its question in another case, in time, from an upstream known to echo case: fetched over TCP
	replyLate                       // its answer, or its question in another case, after its deadline: not in time
	replyBare                       // an error without a question, with its ID: its answer (noquestion.go)
)

// caseCheck is an upstream's 0x20 state: whether it is on, the probe
// series, and the counts Stats reports.
type caseCheck struct {
	plain      atomic.Bool  // 0x20 off: the upstream does not echo case
	probing    atomic.Bool  // a probe series is under way (or 0x20 is off: no more)
	changed    atomic.Int32 // probes in a row answered case-changed; touched by one probe at a time
	quickest   quickest     // the quickest exact replies, to bound a probe's wait
	folded     quickest     // the quickest replies in another case, in time: W while no exact one is known
	mismatches atomic.Uint64
	probes     atomic.Uint64
	resends    atomic.Uint64
	fetches    atomic.Uint64
}

// echoes reports whether the upstream has answered a query with its case
// echoed exactly, once at least since New. An exact reply needs the case,
// so no off-path forger can make it true; and quickest forgets no exact
// reply for good (a period with none keeps the last one's), so once true
// it stays true.
func (cc *caseCheck) echoes() bool {
	_, ok := cc.quickest.get()
	return ok
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

// bothCases turns the first letter of name (mixed by mixCase) to the other
// case if all its letters came out in one case, so that a name of two
// letters or more has both: a probe's name must not come back unchanged
// from an upstream that folds every name to lower or to upper case.
func bothCases(name []byte) {
	first, upper, lower := -1, false, false
	for i, b := range name {
		if !isLetter(b) {
			continue
		}
		if first < 0 {
			first = i
		}
		upper = upper || b&0x20 == 0
		lower = lower || b&0x20 != 0
	}
	if upper != lower { // all in one case: the first letter takes the other
		name[first] ^= 0x20
	}
}

// letters counts the ASCII letters of name.
func letters(name []byte) int {
	n := 0
	for _, b := range name {
		if isLetter(b) {
			n++
		}
	}
	return n
}

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
// caller's case, the same question with the name's case folded; or, to a
// query that is not a probe, an error without a question (noquestion.go).
func (c *call) match(reply []byte) verdict {
	if len(reply) < wire.HeaderLen || wire.ID(reply) != wire.ID(c.wire) || wire.Flags(reply)&wire.FlagQR == 0 {
		return replyForeign
	}
	switch qd, _, _, _ := wire.Counts(reply); {
	case qd == 0 && !c.probe && bareError(reply):
		return replyBare
	case qd != 1 || len(reply) < c.qend:
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
