package upstream

import "dnsproxi/internal/wire"

// An error without a question. A server that cannot parse a query, or does
// not implement it, may answer with the header alone (RFC 1035 §4.1.1:
// FORMERR, NOTIMP, REFUSED); servers that predate EDNS answer so to every
// query that carries an OPT record. Such a reply names no question to
// match, so it was ignored, and the query waited out its deadline: its
// client got SERVFAIL a whole timeout late, and the breaker counted a
// failure of an upstream that had answered (an old server's EDNS clients
// opened its breaker for everyone: TestUpstreamErrorWithoutQuestionLeavesTheBreakerClosed).
//
// It answers the query whose ID it carries when its rcode is neither
// NOERROR nor NXDOMAIN (an answer about a name must name it) and it
// carries no record but an OPT (records about no question are about
// nothing we asked), as Unbound takes one with 0x20 on and dnsdist
// by default. An off-path forger must still hit the ID and the port; what
// it skips is the case, and all it can forge is an error for one query,
// which no cache stores. A probe never takes one: its verdict is the case
// of a question, and this names none.
//
// The caller gets it with the question put back (withQuestion), so that
// every reply handed on has its query's question, as the proxy's answers
// are built from it.

// bareError reports whether reply, a response with no question, may
// answer a query: its rcode is an error, it reads to its end, and it holds
// no record but an OPT (with the extended rcode and Extended DNS Errors).
// Another record would be about no question, and its compressed names
// would point elsewhere once the question is put back.
func bareError(reply []byte) bool {
	rcode := wire.Flags(reply) & 0xF
	if rcode == rcodeNoError || rcode == rcodeNXDomain {
		return false
	}
	sec, ok := wire.ReadSections(reply, wire.HeaderLen)
	return ok && sec.End == len(reply) && sec.AN == 0 && sec.NS == 0 && sec.AR == 0
}

const (
	rcodeNoError  = 0
	rcodeNXDomain = 3
)

// withQuestion returns a copy of reply, which has no question, with
// question (a query's, as sent) put after its header. A name in its
// additional records that points into the message would now point
// elsewhere: bareError lets through no record but an OPT, whose name is
// the root.
func withQuestion(reply, question []byte) []byte {
	b := make([]byte, 0, len(reply)+len(question))
	b = append(b, reply[:wire.HeaderLen]...)
	b[5] = 1 // qdcount, 0 before
	b = append(b, question...)
	return append(b, reply[wire.HeaderLen:]...)
}
