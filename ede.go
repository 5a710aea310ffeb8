package main

import (
	"encoding/binary"
	"errors"
	"os"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
	"dnsproxi/metrics"
	"dnsproxi/upstream"
)

// ede is an Extended DNS Error (RFC 8914) the proxy puts on an answer it
// makes itself, for a client that sent EDNS: an info code, and a short text
// for the human reading dig's output.
type ede struct {
	code uint16
	text string
}

// The proxy's own Extended DNS Errors. Every text is short on purpose: the
// largest own answer (a 255-byte name, the OPT record and this option) must
// fit the 512 bytes every client takes.
var (
	edeDenied       = &ede{dns.ExtendedErrorCodeProhibited, "not in the access list"}
	edeClientLimit  = &ede{dns.ExtendedErrorCodeOther, "client rate limit"}
	edeRateLimit    = &ede{dns.ExtendedErrorCodeOther, "rate limit"}
	edeOverloaded   = &ede{dns.ExtendedErrorCodeOther, "too many queries in flight"}
	edeOutbound     = &ede{dns.ExtendedErrorCodeOther, "upstream rate limit"}
	edeBreakerOpen  = &ede{dns.ExtendedErrorCodeNoReachableAuthority, "upstream circuit breaker open"}
	edeTimeout      = &ede{dns.ExtendedErrorCodeNoReachableAuthority, "upstream timed out"}
	edeNetworkError = &ede{dns.ExtendedErrorCodeNetworkError, "no valid reply from upstream"}
)

// upstreamFailure is how a client is answered when its query's exchange
// ended without a usable reply.
type upstreamFailure struct {
	rcode   int
	ede     *ede
	outcome metrics.Outcome
}

// failureOf is the answer to a query whose exchange ended with err (nil: a
// reply came that is not a valid answer): SERVFAIL with upstreamEDE's
// code, counted upstream_error — unless the upstream layer meant to send
// the query again on its own (a TCP re-send, a fetch over TCP) and the
// outbound limit had no token for it (upstream.ErrLimited). The proxy's
// own limit ended that query, as it ends a first attempt at handleQuery's
// step 4b, and the client is told so in the same words: REFUSED, EDE 0
// "upstream rate limit", counted upstream_limited.
func failureOf(err error) upstreamFailure {
	if errors.Is(err, upstream.ErrLimited) {
		return upstreamFailure{dns.RcodeRefused, edeOutbound, metrics.UpstreamLimited}
	}
	return upstreamFailure{dns.RcodeServerFailure, upstreamEDE(err), metrics.UpstreamError}
}

// upstreamEDE is the Extended DNS Error of an exchange that failed with err
// (nil: a reply came that is not a valid answer): No Reachable Authority
// when the deadline passed, Network Error for everything else.
func upstreamEDE(err error) *ede {
	if errors.Is(err, upstream.ErrTimeout) || errors.Is(err, os.ErrDeadlineExceeded) {
		return edeTimeout
	}
	return edeNetworkError
}

// appendEDE appends e as an EDNS option: code 15, its length, the info code
// and the text.
func appendEDE(dst []byte, e *ede) []byte {
	dst = binary.BigEndian.AppendUint16(dst, wire.OptionEDE)
	dst = binary.BigEndian.AppendUint16(dst, uint16(2+len(e.text)))
	dst = binary.BigEndian.AppendUint16(dst, e.code)
	return append(dst, e.text...)
}
