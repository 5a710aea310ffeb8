package upstream

import "errors"

// The sends the upstream makes on its own. Forward is asked for one send,
// and the caller has paid for it (the pool's outbound token). The upstream
// puts a query on the wire again in four cases: a TCP connection failed
// under it (tcpConn.fail), it is fetched over TCP (its UDP reply was too
// large to read, or came in another case from an upstream known to echo
// case), its reply came in another case just as 0x20 was switched off and
// it goes again in the caller's case, and the probes of a 0x20 series
// (case.go). Two rules hold for all of them:
//
//   - Each is paid: Config.AllowExtra is asked right before it, and a
//     refusal means the query is not sent; it ends with ErrLimited, a
//     query never sent (NotSent), and a probe series ends. So the outbound
//     limit bounds everything the upstream sees, not only the attempts.
//   - A query goes out maxSends times at most, the caller's send
//     included, whatever the upstream does. Without that bound an upstream
//     that answers one query per connection and closes (a server shedding
//     load, as RFC 7766 lets it) was sent n pipelined queries n + (n-1) +
//     ... + 1 times (10: 55; the 64 a connection carries: 2,080), each
//     failed connection sending the rest again until their deadline. With
//     it, n queries cost it 3n at most.
//
// Why three: the plain-case re-send and the TCP fetch happen once each by
// construction (after the one the name is in the caller's case, and a
// query fetched over TCP stays there), so only a lost TCP connection
// repeats. Three
// sends let a query survive any one reason and one lost connection on top
// (a connection closed as it idled out, or after answering its first
// query), which covers every upstream that answers more than one query a
// connection. A query that needs more ends as a lost connection
// (errConnLost, a failure), and the pool's retry, budgeted and paid like
// any attempt, takes over.
const maxSends = 3

// errSentOften ends a query that would go out more than maxSends times by
// any way but a lost TCP connection (which ends with errConnLost): it
// cannot happen with today's reasons to send again, and is a failure if
// one is added.
var errSentOften = errors.New("upstream: the query went out as often as one may")

// extraSend readies c to go out once more, beyond the send Forward was
// asked for: it counts the send and pays Config.AllowExtra for it. It
// returns errSentOften if c went out maxSends times already, ErrLimited if
// AllowExtra refuses; then c is not to be sent, and the caller, who took c
// out of its table, reports it with that error.
func (u *Upstream) extraSend(c *call) error {
	if c.sends >= maxSends {
		return errSentOften
	}
	if !u.allowExtra() {
		return ErrLimited
	}
	c.sends++
	return nil
}

// allowExtra pays Config.AllowExtra for one send the upstream makes on its own.
func (u *Upstream) allowExtra() bool { return u.cfg.AllowExtra == nil || u.cfg.AllowExtra() }
