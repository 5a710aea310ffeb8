package cache

import (
	"encoding/binary"
	"time"

	"dnsproxi/internal/wire"
)

// Extended DNS Error info codes of a stale answer (RFC 8914).
const (
	EDEStaleAnswer   = 3
	EDEStaleNXDomain = 19
)

// Hit is what Lookup found: what an answer is built from. The records it
// gives follow the question in a message (their compressed names point
// there), so an answer is the client's header and question, then
// AppendRecords, then the client's own OPT. Its zero value is no hit.
type Hit struct {
	e        *entry
	age      uint32 // whole seconds since the entry was stored
	stale    bool
	prefetch bool
}

// Flags returns the stored header flags: the upstream's RA, AD and RCODE.
// TC is never set and AA never kept: a cached answer is not authoritative.
func (h Hit) Flags() uint16 { return h.e.flags }

// Counts returns the records in the answer, authority and additional
// sections; the additional count leaves out the OPT record.
func (h Hit) Counts() (an, ns, ar int) { return int(h.e.an), int(h.e.ns), int(h.e.ar) }

// Negative reports whether the answer is NXDOMAIN or NODATA.
func (h Hit) Negative() bool { return h.e.negative() }

// Stale reports whether the answer is past its TTL: its records say
// StaleTTL, and it carries the EDE StaleEDE gives.
func (h Hit) Stale() bool { return h.stale }

// Prefetch reports whether this lookup is the one, in the entry's last
// tenth of TTL, that should refresh it in the background (Config.Prefetch).
func (h Hit) Prefetch() bool { return h.prefetch }

// TTL returns the seconds the answer's records count from: the entry's TTL
// less its age, or StaleTTL for a stale answer.
func (h Hit) TTL() uint32 {
	if h.stale {
		return StaleTTL
	}
	return h.e.ttl - min(h.age, h.e.ttl)
}

// Len returns the length of the records AppendRecords appends.
func (h Hit) Len() int { return len(h.e.records()) }

// AppendRecords appends the records to dst, every TTL counted down by the
// entry's age (StaleTTL each when stale), and returns the extended slice.
// It allocates only if dst has no room.
func (h Hit) AppendRecords(dst []byte) []byte {
	start := len(dst)
	dst = append(dst, h.e.records()...)
	h.CountDown(dst[start:])
	return dst
}

// Records returns the stored records as they are, every TTL as at age 0:
// for a proxy that copies them into its answer itself and then calls
// CountDown on its copy, so they are copied once. The slice is the cache's
// own, shared by every hit: never write to it.
func (h Hit) Records() []byte { return h.e.records() }

// CountDown rewrites the TTL of every record in recs, an unchanged copy of
// the records Records gives, for this hit: what AppendRecords does after
// its copy.
func (h Hit) CountDown(recs []byte) {
	for offsets := h.e.offsets(); len(offsets) >= 2; offsets = offsets[2:] {
		at := int(binary.BigEndian.Uint16(offsets))
		field := recs[at : at+4]
		ttl := uint32(StaleTTL)
		if !h.stale {
			ttl = binary.BigEndian.Uint32(field)
			ttl -= min(ttl, h.age)
		}
		binary.BigEndian.PutUint32(field, ttl)
	}
}

// RefreshFailed tells the cache that refreshing this hit's entry failed at
// now, as Cache.RefreshFailed does, but marks this entry only: an answer
// stored meanwhile under the same key by another refresh that succeeded is
// left as it is, refreshed as any other when it expires. (Marking whatever
// the key held put such a fresh answer under the recheck timer: served
// stale, the upstream not asked, for up to 30 s after it expired.)
func (h Hit) RefreshFailed(now time.Time) {
	if h.e != nil {
		h.e.recheck.Store(mono(now) + int64(RecheckAfter))
	}
}

// StaleEDE returns the Extended DNS Error info code of this answer served
// stale: EDEStaleNXDomain for an NXDOMAIN, EDEStaleAnswer otherwise.
func (h Hit) StaleEDE() uint16 {
	if h.e.flags&0xF == rcodeNXDo {
		return EDEStaleNXDomain
	}
	return EDEStaleAnswer
}

// AppendStaleEDE appends the EDNS option of StaleEDE (code, length, info
// code, no text) to dst, as the options of an OPT record hold it.
func (h Hit) AppendStaleEDE(dst []byte) []byte {
	dst = binary.BigEndian.AppendUint16(dst, wire.OptionEDE)
	dst = binary.BigEndian.AppendUint16(dst, 2)
	return binary.BigEndian.AppendUint16(dst, h.StaleEDE())
}
