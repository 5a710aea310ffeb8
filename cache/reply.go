package cache

// What is stored, and for how long:
//
//   - Stored: a response (QR) to a standard query (opcode 0) with one
//     question, the key's, that is NOERROR with records, NOERROR with no
//     answer but an SOA in the authority section (NODATA), or NXDOMAIN with
//     an SOA there. Never: TC, any other RCODE (SERVFAIL, REFUSED,
//     FORMERR...), an extended RCODE (the OPT's upper bits, e.g. BADVERS,
//     whose lower bits read as NOERROR), a NODATA or NXDOMAIN without an SOA
//     (RFC 2308 §5), a zone transfer, a reply carrying an EDNS Client
//     Subnet option, or one whose records do not walk or hold a name a
//     client cannot read (wire.NamesReadable: a pointer that loops, points
//     past the message or anywhere but an earlier name; RDATA that its
//     names and fixed fields do not fill). Store refuses it like any
//     other, so the entry it would have replaced stays as it was.
//   - Kept: the records up to the OPT record, exactly as sent (compressed
//     names point into the question and earlier records, which the answer
//     built from them holds at the same offsets). The OPT record and
//     whatever follows it (a TSIG signs the upstream's hop) are dropped.
//   - The entry's TTL is the smallest TTL among the answer and authority
//     records, and for a negative answer the SOA's MINIMUM too (RFC 2308
//     §5), clamped to [MinTTL, MaxTTL], or to [MinTTL, MaxNegativeTTL] for
//     a negative answer (NXDOMAIN, or NOERROR with no answer). A TTL with its
//     top bit set is read as 2^31−1 (RFC 8767 §4), which the clamp caps. A
//     smallest TTL of 0 is never stored, MinTTL or not: the authority asked
//     for no caching. The OPT record's TTL field
//     holds the extended RCODE and flags: it is never read as a TTL.
//   - Each kept record's TTL is rewritten once, at Store, to what the
//     answer says at age 0: its own TTL clamped like the entry's (so it
//     never falls below the entry's while the entry is fresh; an additional
//     record below the entry's may reach 0), and in a negative answer at
//     most the entry's TTL, since that is how long the negative answer
//     lives. A hit subtracts the entry's age in whole seconds.
//   - AA is cleared: an answer from a cache is not authoritative.

import (
	"encoding/binary"
	"errors"

	"dnsproxi/internal/wire"
)

// Reasons Store gives for not storing a reply; callers use errors.Is.
var (
	ErrMalformed   = errors.New("cache: reply does not parse as an answer to one standard query")
	ErrQuestion    = errors.New("cache: reply's question is not the key's")
	ErrTruncated   = errors.New("cache: reply is truncated (TC)")
	ErrRcode       = errors.New("cache: reply's RCODE is neither NOERROR nor NXDOMAIN")
	ErrNoSOA       = errors.New("cache: negative answer without an SOA")
	ErrZeroTTL     = errors.New("cache: reply's TTL is 0")
	ErrUncacheable = errors.New("cache: zone transfers and client-subnet answers are not cached")
)

// DNS types and RCODEs read here.
const (
	typeCNAME = 5
	typeSOA   = 6
	typeIXFR  = 251
	typeAXFR  = 252
	typeANY   = 255
	rcodeNXDo = 3
)

// maxMessage is the length of the longest DNS message.
const maxMessage = 65535

// maxTTL is the largest TTL a record may hold (RFC 2181 §8); a larger one
// is read as maxTTL (RFC 8767 §4).
const maxTTL = 1<<31 - 1

// reply is a reply read for storing: where its kept records lie and what
// its TTL rules gave.
type reply struct {
	flags      uint16 // RA, AD and RCODE, as the upstream sent them
	an, ns, ar int    // kept records per section
	start, end int    // msg[start:end] holds the kept records
	ttl        uint32 // the entry's TTL, clamped
	negative   bool
}

// readReply checks msg, an upstream's reply, against the rules above for
// the question in key (Key.Bytes: the question lower-cased, then the bits)
// and the clamps in cfg. It reads and changes nothing else.
func readReply(msg, key []byte, cfg *Config) (reply, error) {
	var r reply
	if len(msg) < wire.HeaderLen || len(msg) > maxMessage {
		return r, ErrMalformed
	}
	flags := wire.Flags(msg)
	qend, ok := wire.QuestionEnd(msg)
	if qd, _, _, _ := wire.Counts(msg); !ok || qd != 1 || flags&wire.FlagQR == 0 || wire.Opcode(msg) != 0 {
		return r, ErrMalformed
	}
	if len(key) < 1 || !wire.EqualQuestion(msg[wire.HeaderLen:qend], key[:len(key)-1]) {
		return r, ErrQuestion
	}
	if qt := wire.QType(msg, qend); qt == typeAXFR || qt == typeIXFR {
		return r, ErrUncacheable
	}
	sec, ok := wire.ReadSections(msg, qend)
	switch {
	case !ok, sec.SigMisplaced():
		return r, ErrMalformed
	case flags&wire.FlagTC != 0:
		return r, ErrTruncated
	case sec.OPT.ExtRcode != 0 || (flags&0xF != 0 && flags&0xF != rcodeNXDo):
		return r, ErrRcode
	case sec.OPT.ECS:
		return r, ErrUncacheable
	}
	r.flags = flags & (wire.FlagRA | wire.FlagAD | 0xF)
	r.start = qend
	r.end, r.ar = sec.Relayed() // never the OPT record or a transaction signature (RFC 6895 §3.1: meta-records are not cached)
	r.an, r.ns = sec.AN, sec.NS
	if !wire.NamesReadable(msg, qend, r.an+r.ns+r.ar) {
		return r, ErrMalformed // kept records only: the OPT, a signature and what follows them are dropped unread
	}
	least, minimum, soa, answered, ok := leastTTL(msg, r.start, r.an, r.ns, wire.QType(msg, qend))
	r.negative = flags&0xF == rcodeNXDo || !answered
	if r.negative {
		least = min(least, minimum) // how long the negative answer lives (RFC 2308 §5)
	}
	switch {
	case !ok:
		return r, ErrMalformed
	case r.negative && !soa:
		return r, ErrNoSOA
	case least == 0:
		return r, ErrZeroTTL
	}
	r.ttl = cfg.clamp(least, r.negative)
	return r, nil
}

// leastTTL walks the answer and authority records from off and returns
// their smallest TTL; the smallest MINIMUM of an SOA in the authority
// section, which bounds a negative answer only (RFC 2308 §5: counted for
// every answer, as it once was, it cut a name's records with an SOA beside
// them to their zone's negative TTL); whether there was such an SOA; and
// whether the answer section
// answers qtype: holds a record of that type, or any record for a query of
// type CNAME or ANY. One that does not is NODATA even with records in it:
// a CNAME chain to a name without the type asked for (RFC 2308 §2.2). The
// records were walked by wire.ReadSections already; ok is false only for
// an SOA too short to hold its five numbers.
func leastTTL(msg []byte, off, an, ns int, qtype uint16) (least, minimum uint32, soa, answered, ok bool) {
	least, minimum = maxTTL, maxTTL
	answered = an > 0 && (qtype == typeCNAME || qtype == typeANY)
	for i := range an + ns {
		off = skipName(msg, off)
		typ := binary.BigEndian.Uint16(msg[off:])
		answered = answered || i < an && typ == qtype
		ttl := readTTL(msg[off+4:])
		rdlen := int(binary.BigEndian.Uint16(msg[off+8:]))
		off += 10 + rdlen
		if typ == typeSOA && i >= an {
			if rdlen < 22 { // two names of one byte at least, and five numbers
				return 0, 0, false, false, false
			}
			soa = true
			minimum = min(minimum, readTTL(msg[off-4:]))
		}
		least = min(least, ttl)
	}
	return least, minimum, soa, answered, true
}

// readTTL reads a TTL; one with the top bit set is maxTTL, which the clamps
// then cap. RFC 8767 §4 reads such a value as the large positive number it
// is, to be capped, where RFC 2181 §8, which it updates, read it as 0: then
// such an answer was never stored (TestTTLWithTheTopBitSetIsCappedNotZero).
func readTTL(b []byte) uint32 {
	return min(binary.BigEndian.Uint32(b), maxTTL)
}

// skipName returns where the name at off ends, in a message whose records
// wire.ReadSections has walked.
func skipName(msg []byte, off int) int {
	for {
		switch l := int(msg[off]); {
		case l == 0:
			return off + 1
		case l&0xC0 == 0xC0:
			return off + 2
		default:
			off += l + 1
		}
	}
}

// appendRecords appends r's kept records from msg to dst, every TTL
// rewritten to its value at age 0, then each TTL field's offset among the
// records as two bytes. It returns dst and how many records it wrote.
func (r *reply) appendRecords(dst, msg []byte, cfg *Config) []byte {
	base := len(dst)
	dst = append(dst, msg[r.start:r.end]...)
	recs := dst[base:]
	off := 0
	for range r.an + r.ns + r.ar {
		off = skipName(recs, off)
		at := off + 4
		ttl := cfg.clamp(readTTL(recs[at:]), r.negative)
		if r.negative {
			ttl = min(ttl, r.ttl)
		}
		binary.BigEndian.PutUint32(recs[at:], ttl)
		off = at + 6 + int(binary.BigEndian.Uint16(recs[at+4:]))
		dst = binary.BigEndian.AppendUint16(dst, uint16(at))
		recs = dst[base : base+len(recs)] // dst may have moved
	}
	return dst
}
