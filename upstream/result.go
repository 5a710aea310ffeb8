package upstream

// What an exchange's result says about the upstream, decided here once for
// the breaker, the retries and the stale answers alike:
//
//   - An answer is any reply that validates (ID, QR, question), whatever
//     its rcode: SERVFAIL and REFUSED are answers. The upstream is up and
//     talking; whether such an answer is worth retrying elsewhere is a
//     decision about the answer, not about the upstream's health.
//   - A failure is a network error, no valid reply, or a timeout while the
//     upstream answered nothing else in time.
//   - Uncounted is everything that says nothing about the upstream: a
//     query cut short by Close, one never sent (no question, no free ID, a
//     full send queue, the outbound limit on a send again: the proxy's own
//     limits, not the upstream's), and a
//     timeout while the upstream answered other queries.
//
// The last rule is what tells a dead upstream from a slow name. A name whose
// authority is slow times out while its neighbours are answered; a dead or
// uniformly slow upstream answers nothing in time. So every valid reply
// taken off the wire stamps the Upstream (one atomic store, no lock, no
// allocation), and a query that reaches its deadline compares that stamp
// with the moment it was sent: stamped since, the upstream was answering
// while it waited, and it ends with ErrNameTimeout; not stamped since, it
// ends with ErrTimeout. A reply that arrives after its own query's deadline
// answers nothing and stamps nothing: late is not "in time", so a
// uniformly slow upstream still fails. The reader that finds it takes its
// query out and ends it with the timeout the sweeper would have given
// (whoever takes a query out reports it); the UDP reader judges a whole
// batch by one clock reading taken after it came in, so never more kindly
// than the sweeper. Forged or malformed replies stamp nothing either, so an
// off-path sender cannot make a dead upstream look alive.
//
// "While it waited" runs until the query is taken out, not to its
// deadline: the comparison is made then, and one stamp, the latest, is
// kept. The sweeper takes a query out within one sweep (a twentieth of
// Config.Timeout, 1 to 100 ms) after its deadline, so a reply taken in
// time for another query in that span vouches too: a query given a
// 20 ms deadline by ForwardUntil, on an upstream with a 2 s timeout that
// answers a neighbour 1 ms after that deadline, ends with ErrNameTimeout.
// The grace only ever goes to an upstream that was answering; keeping
// every stamp to judge exactly at the deadline would cost a lock.
//
// What the rule cannot see, and why that is the right trade:
//
//   - An upstream that answers only what it has cached and times out every
//     uncached name (its own path to the authorities is broken) stays
//     "alive". Opening the breaker would turn its cached answers into
//     SERVFAIL too: worse for every client. The uncached names cost each
//     client the timeout and hold a place under DNS_MAX_INFLIGHT meanwhile;
//     their remedy is a retry at another upstream, which sees the timeout
//     (ErrNameTimeout is an ErrTimeout) and is not stopped by this verdict.
//     The same holds for a lossy path: as long as some replies come back
//     within every timeout, the losses are for retries to repair, and the
//     breaker answers only "is the upstream answering at all".
//   - A flood of one slow name while nothing else is asked has no
//     neighbour to vouch for the upstream: its timeouts are failures and
//     the breaker may open. The flood gets its SERVFAIL at once instead of
//     after the timeout, and the upstream is spared it; a probe for another
//     name, after a cool-off, closes the breaker. A half-open probe for a
//     slow name fails (nothing else is let through to vouch), and the next
//     cool-off probes again. This is the rule's
//     blind spot: beside such a flood (an attacker with a slow zone can
//     make one), clients that ask less than once per timeout are refused
//     while it lasts. A probe the proxy makes itself, for a name known to
//     answer, would close that gap; it belongs with the health checks of
//     the set of upstreams.

import (
	"errors"
	"fmt"
	"net"
	"time"

	"dnsproxi/internal/batchio"
)

// ErrNameTimeout ends a query that got no valid reply before its deadline
// while the upstream answered other queries: the name is slow, not the
// upstream. It is a kind of ErrTimeout: errors.Is(ErrNameTimeout,
// ErrTimeout) is true, so callers that only ask "did it time out" need not
// know it. ErrTimeout alone means the upstream answered nothing in time.
var ErrNameTimeout = fmt.Errorf("%w, while the upstream answered other queries", ErrTimeout)

// Verdict is what the result of one exchange says about the upstream's
// health: the breaker counts an Answer as a success and a Failure as a
// failure, and records nothing for Uncounted. The zero value is Answer.
type Verdict int

// The verdicts Judge hands out.
const (
	Answer    Verdict = iota // a reply that validates, any rcode
	Failure                  // a network error, no valid reply, or a timeout while nothing else was answered
	Uncounted                // says nothing about the upstream: shutdown, never sent, a slow name's timeout, a folded reply's lost fetch
)

// String returns "answer", "failure" or "uncounted".
func (v Verdict) String() string {
	switch v {
	case Answer:
		return "answer"
	case Failure:
		return "failure"
	case Uncounted:
		return "uncounted"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// Judge returns the verdict on one exchange as a Result reports it: reply
// (a reply that validated, or nil) and err. It allocates nothing.
func Judge(reply []byte, err error) Verdict {
	switch {
	case err == nil && reply != nil:
		return Answer
	case err == nil:
		return Failure // no error and no reply: no valid reply
	case errors.Is(err, ErrNameTimeout), errors.Is(err, errFetchLost),
		errors.Is(err, ErrClosed), errors.Is(err, net.ErrClosed), // shutdown
		NotSent(err):
		return Uncounted
	}
	return Failure
}

// NotSent reports whether err ended a query before it left the process: no
// question to match a reply against, no free message ID, a full send
// queue, or the outbound limit refused to send it again (ErrLimited).
// Those are the proxy's own limits; the upstream was not asked.
func NotSent(err error) bool {
	return errors.Is(err, ErrBusy) || errors.Is(err, ErrNoQuery) || errors.Is(err, batchio.ErrQueueFull) ||
		errors.Is(err, ErrLimited)
}

// markAnswered stamps now, the moment a valid reply was taken in time for a
// query. A plain store, not a compare-and-swap: two readers racing may leave
// the earlier of their two stamps, microseconds old, which can only judge a
// query sent in those microseconds more harshly.
func (u *Upstream) markAnswered(now time.Time) {
	u.answered.Store(int64(now.Sub(u.epoch)))
}

// pastDeadline is the error c ends with once its deadline has passed,
// whoever takes it out (the sweeper, or a reader holding a late reply): a
// probe that had a case-changed reply in time and no exact one ends with
// errCaseChanged (case.go), any other query as timeoutFor says.
func (u *Upstream) pastDeadline(c *call) error {
	if c.probe && c.suspect {
		return errCaseChanged
	}
	return u.timeoutFor(c)
}

// timeoutFor is the error a query that reached its deadline ends with:
// ErrNameTimeout if the upstream answered another query since c was sent,
// ErrTimeout if not.
func (u *Upstream) timeoutFor(c *call) error {
	sent := c.sent.Sub(u.epoch) // monotonic, as the stamp is
	if time.Duration(u.answered.Load()) > sent {
		return ErrNameTimeout
	}
	return ErrTimeout
}
