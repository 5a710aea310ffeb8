package wire

import "encoding/binary"

// TypeOPT is the type of the EDNS pseudo-record (RFC 6891).
const TypeOPT = 41

// Types of the transaction signatures a message may end with: TSIG (RFC
// 8945 §5.1) and SIG(0), a SIG record covering type 0 (RFC 2931 §3).
const (
	TypeSIG  = 24
	TypeTSIG = 250
)

// EDNS option codes the proxy looks at.
const (
	OptionECS = 8  // EDNS Client Subnet (RFC 7871)
	OptionEDE = 15 // Extended DNS Error (RFC 8914)
)

// EDNS is what a message's OPT record says. Its zero value is a message
// without one.
type EDNS struct {
	Present  bool
	Size     int  // the UDP payload size the sender takes, as written (the OPT's class)
	ExtRcode int  // the upper 8 bits of the 12-bit RCODE: the OPT TTL's high byte, never a TTL
	Version  int  // the EDNS version; 0 is the only one defined
	DO       bool // DNSSEC OK
	ECS      bool // an EDNS Client Subnet option is present
}

// Sections tells where a message's records lie after its question.
type Sections struct {
	AN, NS, AR int // records in each section; AR does not count the OPT record
	End        int // where the last record ends
	OPT        EDNS
	// msg[OPTStart:OPTEnd] is the OPT record and msg[OPTData:OPTEnd] its
	// options; all three are 0 without one.
	OPTStart, OPTData, OPTEnd int
	AfterOPT                  int // additional records after the OPT record (counted in AR)
	// SigStart is where the message's transaction signature begins, 0 if
	// it has none: a TSIG or SIG(0) record last in the additional section.
	SigStart int
	// Sigs counts the TSIG and SIG(0) records in every section: more than
	// one, or one that is not last, is a malformed message (RFC 8945 §5.1).
	Sigs int
}

// SigMisplaced reports whether the message holds a transaction signature
// that is not its last record, or more than one: malformed (RFC 8945 §5.1).
func (s Sections) SigMisplaced() bool { return s.Sigs > 1 || s.Sigs == 1 && s.SigStart == 0 }

// Relayed returns where the records a relay passes on end (from the
// question's end) and how many of them are additional records: every
// record before the OPT record, or before a transaction signature. Both
// belong to the hop the message came over — the OPT to its EDNS, the
// signature to a key the next hop does not hold — and anything after them
// goes with them: copying it would move what its compressed names point at.
func (s Sections) Relayed() (end, ar int) {
	switch {
	case s.OPT.Present:
		return s.OPTStart, s.AR - s.AfterOPT
	case s.SigStart != 0:
		return s.SigStart, s.AR - 1
	}
	return s.End, s.AR
}

// ReadSections walks the records of msg from off, where its question
// ends, without decompressing a name or reading any record's data but the
// OPT record's. It reports false for a record cut short, a name that is not
// a run of labels ending at the root or at a pointer, an OPT record outside
// the additional section, with an owner other than the root, or with
// options that do not fill its data exactly, and for a second OPT record.
// Bytes after the last record are not its business: End says where the
// records stop.
func ReadSections(msg []byte, off int) (Sections, bool) {
	var s Sections
	if len(msg) < HeaderLen {
		return s, false
	}
	_, an, ns, ar := Counts(msg)
	for i := range an + ns + ar {
		start := off
		var ok bool
		if off, ok = skipName(msg, off); !ok || off+10 > len(msg) {
			return s, false
		}
		typ := binary.BigEndian.Uint16(msg[off:])
		rdlen := int(binary.BigEndian.Uint16(msg[off+8:]))
		data := off + 10
		off = data + rdlen
		if off > len(msg) {
			return s, false
		}
		if typ == TypeTSIG || typ == TypeSIG && rdlen >= 2 && binary.BigEndian.Uint16(msg[data:]) == 0 {
			s.Sigs++
		}
		switch {
		case typ == TypeOPT:
			if i < an+ns || s.OPT.Present || off-start != 11+rdlen {
				return s, false // outside the additional section, twice, or not owned by the root
			}
			ttl := binary.BigEndian.Uint32(msg[data-6:])
			s.OPT = EDNS{
				Present:  true,
				Size:     int(binary.BigEndian.Uint16(msg[data-8:])),
				ExtRcode: int(ttl >> 24),
				Version:  int(ttl >> 16 & 0xFF),
				DO:       ttl&0x8000 != 0,
			}
			var okOpts bool
			if s.OPT.ECS, okOpts = readOptions(msg[data:off]); !okOpts {
				return s, false
			}
			s.OPTStart, s.OPTData, s.OPTEnd = start, data, off
		case i < an:
			s.AN++
		case i < an+ns:
			s.NS++
		default:
			s.AR++
			if s.OPT.Present {
				s.AfterOPT++
			}
			if i == an+ns+ar-1 && (typ == TypeTSIG || typ == TypeSIG && rdlen >= 2 && binary.BigEndian.Uint16(msg[data:]) == 0) {
				s.SigStart = start
			}
		}
	}
	s.End = off
	return s, true
}

// QuestionsEnd returns where the question section of pkt ends, its qd
// questions skipped (a name after the first may point back). It reports
// false for a question section that does not read.
func QuestionsEnd(pkt []byte, qd int) (int, bool) {
	off := HeaderLen
	for range qd {
		end, ok := skipName(pkt, off)
		if !ok || end+4 > len(pkt) {
			return 0, false
		}
		off = end + 4
	}
	return off, true
}

// skipName returns where the name starting at off ends. A pointer ends it:
// where it points is not followed.
func skipName(msg []byte, off int) (int, bool) {
	for n := 0; off < len(msg); {
		l := int(msg[off])
		switch {
		case l == 0:
			return off + 1, true
		case l&0xC0 == 0xC0:
			return off + 2, off+2 <= len(msg)
		case l > 63:
			return 0, false // the reserved label types
		}
		n += l + 1
		if n > 254 {
			return 0, false
		}
		off += l + 1
	}
	return 0, false
}

// readOptions reports whether the options fill data exactly, and whether
// one of them is an EDNS Client Subnet option.
func readOptions(data []byte) (ecs, ok bool) {
	for len(data) > 0 {
		if len(data) < 4 {
			return false, false
		}
		code, l := binary.BigEndian.Uint16(data), int(binary.BigEndian.Uint16(data[2:]))
		if 4+l > len(data) {
			return false, false
		}
		ecs = ecs || code == OptionECS
		data = data[4+l:]
	}
	return ecs, true
}

// AppendOptions appends to dst every option in data (an OPT record's data,
// as ReadSections checked it) whose code is code and whose data holds at
// least minData bytes, whole.
func AppendOptions(dst, data []byte, code uint16, minData int) []byte {
	for len(data) >= 4 {
		l := 4 + int(binary.BigEndian.Uint16(data[2:]))
		if l > len(data) {
			break
		}
		if binary.BigEndian.Uint16(data) == code && l-4 >= minData {
			dst = append(dst, data[:l]...)
		}
		data = data[l:]
	}
	return dst
}

// OPTLen is the length of an OPT record with no options: the root name,
// type, class (the UDP size), TTL (extended RCODE and flags) and RDLENGTH.
const OPTLen = 11

// AppendOPT appends an OPT record of EDNS version 0 to dst: size as the UDP
// payload size, extRcode as the upper 8 bits of the RCODE, the DO bit, and
// options (already encoded, code and length first) as its data.
func AppendOPT(dst []byte, size, extRcode int, do bool, options []byte) []byte {
	var flags uint16
	if do {
		flags = 0x8000
	}
	dst = append(dst, 0) // the root owns it
	dst = binary.BigEndian.AppendUint16(dst, TypeOPT)
	dst = binary.BigEndian.AppendUint16(dst, uint16(size))
	dst = append(dst, byte(extRcode), 0) // extended RCODE, version 0
	dst = binary.BigEndian.AppendUint16(dst, flags)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(options)))
	return append(dst, options...)
}

// SetCounts writes the four section counts. msg must hold a header.
func SetCounts(msg []byte, qd, an, ns, ar int) {
	binary.BigEndian.PutUint16(msg[4:], uint16(qd))
	binary.BigEndian.PutUint16(msg[6:], uint16(an))
	binary.BigEndian.PutUint16(msg[8:], uint16(ns))
	binary.BigEndian.PutUint16(msg[10:], uint16(ar))
}
