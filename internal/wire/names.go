package wire

import "encoding/binary"

// Reading every name of a message, as a client will. ReadSections walks
// the records without following a pointer or reading any RDATA, which is
// all the fast path needs; a cache that hands the same bytes to every
// client of a name needs more: NamesReadable.
//
// A compression pointer is accepted only where it points at a label of a
// name read earlier in the message (RFC 1035 §4.1.4: "a prior occurrence
// of the same name"): the question, an owner, or a name in an earlier
// RDATA. That one rule does three things. A name cannot loop or point
// past the message, since every hop goes to a name already read whole. It
// cannot point into the header, whose ID and counts differ for each client
// of a cached answer, nor into a TTL, which the cache rewrites and counts
// down, so a name that reads once reads in every answer built from the
// same records. And it costs no decompression: a hop only re-reads bytes
// already checked, to add up the name's length. Compressors point at
// earlier names' labels and nowhere else, so what one writes is not
// refused (TestNamesReadableTakesCompressedAnswers, FuzzNamesReadable).

// maxPointers is the most compression pointers one name may follow: as
// many as a name of 255 octets needs at most, and as many as miekg/dns
// follows before it gives up.
const maxPointers = 126

// pointerReach is how many offsets a compression pointer's 14 bits reach.
const pointerReach = 1 << 14

// labelStarts marks the offsets where a label of a name already read
// starts: the only places a pointer may point. Its words lie on the stack
// of NamesReadable: 128 bytes cleared for a message of up to 1 KiB, 2 KiB
// for a larger one, nothing allocated.
type labelStarts []uint64

// smallMessage is the longest message whose label starts fit the small
// bitmap.
const smallMessage = 1024

func (ls labelStarts) has(off int) bool {
	return off>>6 < len(ls) && ls[off>>6]&(1<<(off&63)) != 0
}

// mark marks the labels of the name at off, one that readName accepted,
// up to its end or its first pointer.
func (ls labelStarts) mark(msg []byte, off int) {
	for off>>6 < len(ls) {
		l := int(msg[off])
		if l == 0 || l&0xC0 == 0xC0 {
			return
		}
		ls[off>>6] |= 1 << (off & 63)
		off += l + 1
	}
}

// NamesReadable reports whether a client can read every name of the n
// records that follow msg's one question, which ends at qend (as
// QuestionEnd read it): each owner, and each name inside the RDATA of the
// types that hold names; and whether that RDATA is as long as its names
// and fixed fields make it (an A record 4 bytes, an SOA its two names and
// 20 bytes, an MX 2 bytes and a name...). A name is runs of labels of 1 to
// 63 octets, 255 octets in all once its pointers are followed, ending at
// the root; its pointers follow the rule above, at most maxPointers of
// them; one inside RDATA ends inside it. Pointers are taken only in the
// RDATA types a receiver decompresses (RFC 3597 §4); in the others (RRSIG,
// NSEC, SVCB, DNAME...) a client may read a pointer as a label, so the
// name must be written out. RDATA past the names of RRSIG, NSEC and SVCB
// (a signature, a type bitmap, service parameters) and the RDATA of other
// types is not read: it holds no name to follow. It allocates nothing.
func NamesReadable(msg []byte, qend, n int) bool {
	if qend < HeaderLen || qend > len(msg) {
		return false
	}
	var small [smallMessage / 64]uint64
	starts := labelStarts(small[:])
	if len(msg) > smallMessage {
		var large [pointerReach / 64]uint64
		starts = large[:]
	}
	starts.mark(msg, HeaderLen)
	off := qend
	for range n {
		end, ok := readName(msg, off, len(msg), true, starts)
		if !ok || end+10 > len(msg) {
			return false
		}
		starts.mark(msg, off)
		typ := binary.BigEndian.Uint16(msg[end:])
		data := end + 10
		off = data + int(binary.BigEndian.Uint16(msg[end+8:]))
		if off > len(msg) || !rdataReadable(msg, typ, data, off, starts) {
			return false
		}
	}
	return true
}

// readName returns where the name at off ends in place, and whether it
// reads (NamesReadable's rules), its own bytes lying before end. A pointer
// is taken only if compressed is true.
func readName(msg []byte, off, end int, compressed bool, starts labelStarts) (int, bool) {
	next, octets, hops := 0, 0, 0
	for {
		if off >= end {
			return 0, false
		}
		l := int(msg[off])
		switch {
		case l == 0:
			if hops == 0 {
				next = off + 1
			}
			return next, true
		case l&0xC0 == 0xC0:
			if !compressed || off+2 > end {
				return 0, false
			}
			if hops++; hops == 1 {
				next = off + 2
			}
			off = int(binary.BigEndian.Uint16(msg[off:]) & 0x3FFF)
			if hops > maxPointers || !starts.has(off) {
				return 0, false
			}
			end = len(msg) // a name read earlier: wherever it lies
			continue
		case l > 63:
			return 0, false // the reserved label types
		}
		if octets += l + 1; octets > 254 || off+1+l > end {
			return 0, false
		}
		off += l + 1
	}
}

// DNS types whose RDATA holds a name.
const (
	typeNS, typeMD, typeMF, typeCNAME, typeSOA, typeMB, typeMG, typeMR = 2, 3, 4, 5, 6, 7, 8, 9
	typePTR, typeMINFO, typeMX, typeRP, typeAFSDB, typeRT, typeSIG     = 12, 14, 15, 17, 18, 21, 24
	typePX, typeNXT, typeSRV, typeNAPTR, typeKX, typeDNAME             = 26, 30, 33, 35, 36, 39
	typeRRSIG, typeNSEC, typeTALINK, typeSVCB, typeHTTPS, typeLP       = 46, 47, 58, 64, 65, 107
	typeA, typeAAAA                                                    = 1, 28
)

// rdataReadable reports whether the RDATA msg[off:end] of a record of
// type typ reads: its names (readName), marked once read, and its length.
func rdataReadable(msg []byte, typ uint16, off, end int, starts labelStarts) bool {
	// The RDATA is fixed bytes, character strings, names, then rest bytes
	// (-1: any number).
	fixed, strs, names, rest, compressed := 0, 0, 0, 0, true
	switch typ {
	case typeA:
		return end-off == 4
	case typeAAAA:
		return end-off == 16
	case typeNS, typeMD, typeMF, typeCNAME, typeMB, typeMG, typeMR, typePTR:
		names = 1
	case typeSOA:
		names, rest = 2, 20
	case typeMINFO, typeRP:
		names = 2
	case typeMX, typeAFSDB, typeRT:
		fixed, names = 2, 1
	case typePX:
		fixed, names = 2, 2
	case typeSRV:
		fixed, names = 6, 1
	case typeNAPTR:
		fixed, strs, names = 4, 3, 1
	case typeSIG:
		fixed, names, rest = 18, 1, -1
	case typeNXT:
		names, rest = 1, -1
	case typeDNAME:
		names, compressed = 1, false
	case typeTALINK:
		names, compressed = 2, false
	case typeKX, typeLP:
		fixed, names, compressed = 2, 1, false
	case typeRRSIG:
		fixed, names, rest, compressed = 18, 1, -1, false
	case typeNSEC:
		names, rest, compressed = 1, -1, false
	case typeSVCB, typeHTTPS:
		fixed, names, rest, compressed = 2, 1, -1, false
	default:
		return true
	}
	off += fixed
	for range strs {
		if off >= end {
			return false
		}
		off += 1 + int(msg[off])
	}
	for range names {
		start := off
		var ok bool
		if off, ok = readName(msg, off, end, compressed, starts); !ok {
			return false
		}
		starts.mark(msg, start)
	}
	if rest < 0 {
		return off <= end
	}
	return off+rest == end
}
