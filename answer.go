package main

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/dnsserver"
	"dnsproxi/internal/wire"
	"dnsproxi/metrics"
)

// defaultMaxUDPSize is the largest UDP answer, and the size the proxy
// advertises upstream, unless set: the size DNS Flag Day 2020 chose, below
// the path MTU of nearly every network, so no answer is ever fragmented —
// and a fragment is how a spoofed answer slips past ID, port and 0x20.
const defaultMaxUDPSize = 1232

// waiter is one client waiting for an answer: what its answer is built
// for. The question is copied, because a UDP packet is only lent to the
// handler.
type waiter struct {
	w      dnsserver.ResponseWriter
	client netip.AddrPort // for the query log
	start  time.Time
	qtype  metrics.QTypeRow
	id     uint16
	flags  uint16 // the query's header flags: RD, AD and CD matter
	edns   bool   // it sent an OPT record, so its answer carries one
	do     bool
	size   int // the largest answer it takes: its UDP size capped, or 65535 over TCP
	qlen   int
	q      [wire.MaxQuestionLen]byte
}

// set fills wt from q, the query it waits for.
func (wt *waiter) set(w dnsserver.ResponseWriter, q *dnsserver.Query, qtype metrics.QTypeRow, start time.Time, maxUDP int) {
	wt.w, wt.client, wt.start, wt.qtype = w, q.Client, start, qtype
	wt.id, wt.flags = wire.ID(q.Wire), wire.Flags(q.Wire)
	wt.edns, wt.do = q.EDNS.Present, q.EDNS.DO
	wt.size = dns.MaxMsgSize
	if q.Net != "tcp" {
		wt.size = min(q.UDPSize, maxUDP)
	}
	wt.qlen = copy(wt.q[:], q.Wire[wire.HeaderLen:q.QEnd])
}

func (wt *waiter) question() []byte { return wt.q[:wt.qlen] }

// upstreamAnswer is the upstream's reply as read once, for every waiter's
// answer to be built from: its records are copied as they are, compressed
// names and all, and its OPT record is left behind.
type upstreamAnswer struct {
	flags      uint16
	ext        int    // the extended RCODE bits of the upstream's OPT
	records    []byte // every record up to the OPT, as the reply holds them
	an, ns, ar int
	optData    []byte // the upstream OPT's options, for its Extended DNS Errors
}

// readUpstreamAnswer reads reply, an answer to the question q. It reports
// false for a reply whose records cannot be walked, whose question is not
// q's, or whose rcode is about the proxy's own OPT (hopError). The OPT
// record and a transaction signature (TSIG or SIG(0): it signs the
// upstream's hop, with a key the client does not hold) are left behind,
// with whatever follows them (wire.Sections.Relayed).
func readUpstreamAnswer(reply, q []byte) (upstreamAnswer, bool) {
	var ua upstreamAnswer
	if len(reply) < wire.HeaderLen {
		return ua, false
	}
	qend, ok := wire.QuestionEnd(reply)
	if qd, _, _, _ := wire.Counts(reply); !ok || qd != 1 || !wire.EqualQuestion(reply[wire.HeaderLen:qend], q) {
		return ua, false
	}
	sec, ok := wire.ReadSections(reply, qend)
	if !ok {
		if wire.Flags(reply)&wire.FlagTC == 0 {
			return ua, false
		}
		// Truncated at the byte, counts left as they were (some upstreams
		// and middleboxes do): it still says all it has to say, "ask again
		// over TCP". Relayed as TC with empty sections, it is an answer.
		ua.flags = wire.Flags(reply)
		return ua, true
	}
	end, ar := sec.Relayed()
	if (sec.SigStart != 0 || sec.AfterOPT > 0) && !wire.NamesReadable(reply[:end], qend, sec.AN+sec.NS+ar) {
		// Records are left behind past the OPT or a signature, and a kept
		// name may point forward into them: copied as it is, it would
		// point past the client's message. Rare enough to check in full.
		return ua, false
	}
	ua.flags, ua.an, ua.ns, ua.ar = wire.Flags(reply), sec.AN, sec.NS, ar
	ua.records = reply[qend:end]
	if sec.OPT.Present {
		if hopError(sec.OPT.ExtRcode<<4 | int(ua.flags&0xF)) {
			return ua, false
		}
		ua.ext, ua.optData = sec.OPT.ExtRcode, reply[sec.OPTData:sec.OPTEnd]
	}
	return ua, true
}

// hopError reports whether rcode is an error about the OPT record of the
// query it answers: BADVERS (RFC 6891 §6.1.3) or BADCOOKIE (RFC 7873
// §5.3). Upstream, that OPT is the proxy's own (version 0, no cookie), not
// the client's: relayed, the error would tell the client its version or
// cookie is wrong, which it cannot act on. Such a reply is no valid reply,
// a failure like any other: another upstream, a stale answer or SERVFAIL.
func hopError(rcode int) bool {
	return rcode == dns.RcodeBadVers || rcode == dns.RcodeBadCookie
}

// appendFor appends wt's answer: its ID and question, the upstream's flags
// and records, its own OPT (or none) with the upstream's extended RCODE and
// Extended DNS Errors. One that does not fit wt's size, and any the
// upstream truncated over UDP, is sent as TC with empty sections: never a
// partial RRset, never an RRSIG cut from its set.
func (ua *upstreamAnswer) appendFor(dst []byte, wt *waiter, maxUDP int) []byte {
	// The upstream's AA, TC, RA, AD and RCODE; QR, opcode QUERY, and the
	// client's own RD and CD (RFC 1035 §4.1.1, RFC 4035 §3.2.2).
	const fromUpstream = wire.FlagAA | wire.FlagTC | wire.FlagRA | wire.FlagAD | 0xF
	flags := ua.flags&fromUpstream | wire.FlagQR | wt.flags&(wire.FlagRD|wire.FlagCD)
	ext := ua.ext
	if wt.flags&wire.FlagAD == 0 && !wt.do {
		flags &^= wire.FlagAD // RFC 6840 §5.8: AD only for a client that asked with AD or DO
	}
	start := len(dst)
	switch {
	case !wt.edns && ext != 0:
		// An RCODE above 15 cannot be said without OPT: SERVFAIL, no records.
		flags, ext = flags&^0xF|dns.RcodeServerFailure, 0
	case flags&wire.FlagTC == 0 || wt.size == dns.MaxMsgSize:
		dst = appendHeader(dst, wt.id, flags, ua.an, ua.ns, ua.ar, wt.edns)
		dst = append(dst, wt.question()...)
		dst = append(dst, ua.records...)
		if wt.edns {
			dst = appendOPT(dst, maxUDP, ext, wt.do, ua.optData)
		}
		if len(dst)-start <= wt.size {
			return dst
		}
		flags |= wire.FlagTC
	}
	// Empty sections, with the Extended DNS Errors if they fit.
	for _, optData := range [2][]byte{ua.optData, nil} {
		dst = appendHeader(dst[:start], wt.id, flags, 0, 0, 0, wt.edns)
		dst = append(dst, wt.question()...)
		if wt.edns {
			dst = appendOPT(dst, maxUDP, ext, wt.do, optData)
		}
		if len(dst)-start <= wt.size {
			break
		}
	}
	return dst
}

// rcodeFor is the rcode of answer, built by appendFor for wt: the upstream's
// extended RCODE as wt's OPT carries it, or the header's alone.
func (ua *upstreamAnswer) rcodeFor(answer []byte, wt *waiter) int {
	rcode := int(wire.Flags(answer) & 0xF)
	if wt.edns {
		rcode |= ua.ext << 4
	}
	return rcode
}

// appendHeader appends a header with one question.
func appendHeader(dst []byte, id, flags uint16, an, ns, ar int, opt bool) []byte {
	if opt {
		ar++
	}
	dst = binary.BigEndian.AppendUint16(dst, id)
	dst = binary.BigEndian.AppendUint16(dst, flags)
	dst = binary.BigEndian.AppendUint16(dst, 1)
	dst = binary.BigEndian.AppendUint16(dst, uint16(an))
	dst = binary.BigEndian.AppendUint16(dst, uint16(ns))
	return binary.BigEndian.AppendUint16(dst, uint16(ar))
}

// appendOPT appends the proxy's OPT record for a client: its size, the
// client's DO, the upstream's extended RCODE, and of the upstream's
// options only its Extended DNS Errors; cookies, NSID, padding and
// keepalive belong to the hop they came on (RFC 7873, RFC 6891).
func appendOPT(dst []byte, size, ext int, do bool, upstreamOptions []byte) []byte {
	dst = wire.AppendOPT(dst, size, ext, do, nil)
	rdlen := len(dst) - 2
	dst = wire.AppendOptions(dst, upstreamOptions, wire.OptionEDE, 2) // an EDE holds an info code at least
	binary.BigEndian.PutUint16(dst[rdlen:], uint16(len(dst)-rdlen-2))
	return dst
}

// appendOwn appends the proxy's own answer with rcode (SERVFAIL, REFUSED,
// FORMERR, NOTIMP, BADVERS) to a query with id, header flags and question
// (none if empty): its opcode, RD and CD, and an OPT record if it sent one,
// carrying e (if not nil) as an Extended DNS Error. RA is claimed only while
// the upstream claims it.
func (p *proxy) appendOwn(dst []byte, id, qflags uint16, question []byte, edns, do bool, rcode int, e *ede) []byte {
	flags := qflags&(0xF<<11|wire.FlagRD|wire.FlagCD) | wire.FlagQR | uint16(rcode&0xF)
	if p.upstreamRA.Load() != raWithout {
		flags |= wire.FlagRA
	}
	dst = binary.BigEndian.AppendUint16(dst, id)
	dst = binary.BigEndian.AppendUint16(dst, flags)
	qd, ar := 0, 0
	if len(question) > 0 {
		qd = 1
	}
	if edns {
		ar = 1
	}
	dst = append(dst, 0, byte(qd), 0, 0, 0, 0, 0, byte(ar))
	dst = append(dst, question...)
	if edns {
		dst = wire.AppendOPT(dst, p.udpSize(), rcode>>4, do, nil)
		if e != nil {
			rdlen := len(dst) - 2
			dst = appendEDE(dst, e)
			binary.BigEndian.PutUint16(dst[rdlen:], uint16(len(dst)-rdlen-2))
		}
	}
	return dst
}

// What the upstream's most recent answer said of RA: the proxy's own answers
// claim recursion only where the upstream does, and until it has answered.
const (
	raUnseen uint32 = iota
	raWith
	raWithout
)

// noteRA remembers the RA bit of an upstream answer's flags; it writes only
// when it changes, so answers do not all contend for one cache line.
func (p *proxy) noteRA(flags uint16) {
	v := raWith
	if flags&wire.FlagRA == 0 {
		v = raWithout
	}
	if p.upstreamRA.Load() != v {
		p.upstreamRA.Store(v)
	}
}

// udpSize is the largest UDP answer the proxy sends, and advertises upstream.
func (p *proxy) udpSize() int {
	if p.maxUDPSize > 0 {
		return p.maxUDPSize
	}
	return defaultMaxUDPSize
}

// answerBufs holds the buffers answers are built in: a writer keeps a copy
// of what it is given, so one buffer serves query after query.
var answerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1536); return &b }}

// getBuf returns an empty buffer to build an answer in.
func getBuf() *[]byte { return answerBufs.Get().(*[]byte) }

// maxKeptBuf is the largest buffer kept for answers: an occasional large
// TCP answer's is not.
const maxKeptBuf = 8192

// putBuf returns b, the buffer of bp as it grew, to the pool.
func putBuf(bp *[]byte, b []byte) {
	if cap(b) <= maxKeptBuf {
		*bp = b[:0]
		answerBufs.Put(bp)
	}
}
