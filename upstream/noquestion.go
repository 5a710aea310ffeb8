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
// carries no answer or authority record (records about no question are
// about nothing we asked), as Unbound takes one with 0x20 on and dnsdist
// by default. An off-path forger must still hit the ID and the port; what
// it skips is the case, and all it can forge is an error for one query,
// which no cache stores. A probe never takes one: its verdict is the case
// of a question, and this names none.
//
// The caller gets it with the question put back (withQuestion), so that
// every reply handed on has its query's question, as the proxy's answers
// are built from it.

// bareError reports whether reply, a response with no question, may
// answer a query: its rcode is an error, and it holds no records but
// additional ones (an OPT, with the extended rcode and Extended DNS Errors).
func bareError(reply []byte) bool {
	_, an, ns, _ := wire.Counts(reply)
	rcode := wire.Flags(reply) & 0xF
	return an == 0 && ns == 0 && rcode != rcodeNoError && rcode != rcodeNXDomain
}

const (
	rcodeNoError  = 0
	rcodeNXDomain = 3
)

// withQuestion returns a copy of reply, which has no question, with
// question (a query's, as sent) put after its header. A name in its
// additional records that points into the message would now point elsewhere;
// an error without a question has none worth pointing at, and the proxy
// reads such records only to leave its OPT behind.
func withQuestion(reply, question []byte) []byte {
	b := make([]byte, 0, len(reply)+len(question))
	b = append(b, reply[:wire.HeaderLen]...)
	b[5] = 1 // qdcount, 0 before
	b = append(b, question...)
	return append(b, reply[wire.HeaderLen:]...)
}
