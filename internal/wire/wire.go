// Package wire reads and writes the few parts of a DNS message that the
// proxy's fast path needs — the header, the question, where the records lie,
// the OPT record — straight from the packet, without unpacking the whole
// message, and keys a query by what its answer depends on (Key). It imports
// nothing of the proxy's, so a cache may use it too.
package wire

import "encoding/binary"

// HeaderLen is the length of the DNS header.
const HeaderLen = 12

// Header flag bits (RFC 1035 §4.1.1), in the 16-bit flags word.
const (
	FlagQR = 1 << 15
	FlagAA = 1 << 10
	FlagTC = 1 << 9
	FlagRD = 1 << 8
	FlagRA = 1 << 7
	FlagAD = 1 << 5
	FlagCD = 1 << 4
)

// ID returns the message ID. pkt must hold a header.
func ID(pkt []byte) uint16 { return binary.BigEndian.Uint16(pkt) }

// SetID writes the message ID. pkt must hold a header.
func SetID(pkt []byte, id uint16) { binary.BigEndian.PutUint16(pkt, id) }

// Flags returns the flags word. pkt must hold a header.
func Flags(pkt []byte) uint16 { return binary.BigEndian.Uint16(pkt[2:]) }

// SetFlags writes the flags word. pkt must hold a header.
func SetFlags(pkt []byte, flags uint16) { binary.BigEndian.PutUint16(pkt[2:], flags) }

// Opcode returns the opcode. pkt must hold a header.
func Opcode(pkt []byte) int { return int(Flags(pkt)>>11) & 0xF }

// Counts returns the four section counts. pkt must hold a header.
func Counts(pkt []byte) (qd, an, ns, ar int) {
	return int(binary.BigEndian.Uint16(pkt[4:])), int(binary.BigEndian.Uint16(pkt[6:])),
		int(binary.BigEndian.Uint16(pkt[8:])), int(binary.BigEndian.Uint16(pkt[10:]))
}

// QuestionEnd returns where the first question ends: pkt[HeaderLen:end] is
// its name, type and class. It reports false for a packet too short, a
// label over 63 bytes, a name over 255, or a compressed name (a query's
// first name has nothing before it to point at).
func QuestionEnd(pkt []byte) (int, bool) {
	i := HeaderLen
	for nameLen := 0; ; {
		if i >= len(pkt) {
			return 0, false
		}
		l := int(pkt[i])
		if l == 0 {
			i++
			break
		}
		if l > 63 {
			return 0, false // a compression pointer or a reserved label type
		}
		nameLen += l + 1
		if nameLen > 254 {
			return 0, false
		}
		i += l + 1
	}
	if i+4 > len(pkt) {
		return 0, false
	}
	return i + 4, true
}

// QType returns the type of the question ending at qend.
func QType(pkt []byte, qend int) uint16 { return binary.BigEndian.Uint16(pkt[qend-4:]) }

// EqualQuestion reports whether a and b hold the same question, comparing
// the name's letters without regard to ASCII case (some resolvers change
// it) and the type and class, its last four bytes, exactly: type HTTPS (65,
// an 'A' as a byte) is not type 97. A label's length byte (at most 63) is
// never a letter, so folding the whole name is folding its letters only.
func EqualQuestion(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	if string(a) == string(b) { // the usual case, a reply in the case it was asked in: one comparison
		return true
	}
	name := max(len(a)-4, 0)
	for i := range a[:name] {
		x, y := a[i], b[i]
		if x != y && lower(x) != lower(y) {
			return false
		}
	}
	return string(a[name:]) == string(b[name:])
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// EDNSSize returns the UDP payload size of the OPT record that starts at
// off, and whether there is a well-formed OPT record there ending exactly
// at the end of pkt.
func EDNSSize(pkt []byte, off int) (int, bool) {
	// root name (1), type (2), class = size (2), TTL (4), RDLENGTH (2), RDATA
	if off+11 > len(pkt) || pkt[off] != 0 || binary.BigEndian.Uint16(pkt[off+1:]) != 41 {
		return 0, false
	}
	rdlen := int(binary.BigEndian.Uint16(pkt[off+9:]))
	if off+11+rdlen != len(pkt) {
		return 0, false
	}
	return int(binary.BigEndian.Uint16(pkt[off+3:])), true
}

// AppendReply appends to dst an answer to the query q (whose question ends
// at qend) with rcode and no records: q's ID, opcode, RD and CD, QR and RA
// set, and q's question.
func AppendReply(dst, q []byte, qend, rcode int) []byte {
	flags := Flags(q)&(0xF<<11|FlagRD|FlagCD) | FlagQR | FlagRA | uint16(rcode&0xF)
	dst = binary.BigEndian.AppendUint16(dst, ID(q))
	dst = binary.BigEndian.AppendUint16(dst, flags)
	qd := uint16(0)
	if qend > HeaderLen {
		qd = 1
	}
	dst = binary.BigEndian.AppendUint16(dst, qd)
	dst = append(dst, 0, 0, 0, 0, 0, 0)
	return append(dst, q[HeaderLen:qend]...)
}
