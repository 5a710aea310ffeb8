package guard

// The per-client gate in front of a shared bucket, as one gate:
//
//   - The client's bucket is asked first. A client whose bucket is empty is
//     refused there and never touches the shared bucket: a flooder is
//     stopped by its own share before it takes anyone else's tokens.
//   - A query the client's bucket would admit then asks the shared bucket.
//     Refused there, it takes nothing from the client's bucket: under an
//     overload others caused, a client's refused queries do not spend its
//     share, and it is not refused as over its own rate once the overload
//     ends for tokens it never used.
//   - Admitted, it has taken one token of each.
//
// The shared token is taken between reading the client's bucket and moving
// its tat forward, so a client's tat still only ever grows (clienttable.go
// rests on that). If another query of the same prefix takes the client's
// last token in between, this one is refused by its client's bucket after
// all and gives the shared token back, which a TokenBucket takes exactly:
// a token given back into a bucket that refilled meanwhile is capped at
// its burst, as if it had never been taken. For a prefix given a slot, the
// shared bucket is asked under the shard's lock (a few nanoseconds under
// its own mutex, which never takes a shard's): a new prefix the shared
// bucket refuses takes no slot, and evicts no one (clienttable.go's place).

import (
	"net/netip"
	"strconv"
	"time"
)

// Verdict is what AllowWithAt decided for one query.
type Verdict int

// The verdicts of AllowWithAt.
const (
	Admitted        Verdict = iota // a token taken from each bucket
	RefusedByClient                // the client's bucket is empty; the shared one untouched
	RefusedByShared                // the shared bucket is empty; the client's untouched
)

// String names the verdict.
func (v Verdict) String() string {
	switch v {
	case Admitted:
		return "admitted"
	case RefusedByClient:
		return "refused by the client's bucket"
	case RefusedByShared:
		return "refused by the shared bucket"
	}
	return "Verdict(" + strconv.Itoa(int(v)) + ")"
}

// AllowWithAt takes a token from addr's bucket and one from shared, both or
// neither, at the caller's reading now, and says which refused if one did:
// the client's bucket is asked first (see the head comment). An exempt addr
// asks shared alone; a nil shared makes it AllowAt. It does not allocate.
func (l *ClientLimiter) AllowWithAt(now time.Time, addr netip.Addr, shared *TokenBucket) Verdict {
	if l.exempt != nil && l.exempt.Contains(addr) {
		if shared == nil || shared.AllowAt(now, 1) {
			return Admitted
		}
		return RefusedByShared
	}
	s := sharedTake{bucket: shared, now: now}
	switch {
	case l.allow(addr, clampReading(now.Sub(l.epoch)), &s):
		return Admitted
	case s.refused:
		return RefusedByShared
	}
	s.giveBack()
	return RefusedByClient
}

// sharedTake is one query's ask of the shared bucket, made at most once
// whatever retries its client's bucket takes. A nil *sharedTake, or one
// with no bucket, admits.
type sharedTake struct {
	bucket  *TokenBucket
	now     time.Time
	taken   bool // holds one token of bucket
	refused bool // bucket refused: the query is refused, nothing taken
}

// admit takes the shared token, unless already held, and reports whether
// the query holds one.
func (s *sharedTake) admit() bool {
	if s == nil || s.bucket == nil || s.taken {
		return true
	}
	if s.bucket.AllowAt(s.now, 1) {
		s.taken = true
		return true
	}
	s.refused = true
	return false
}

// giveBack returns the shared token of a query its client's bucket refused
// after the token was taken.
func (s *sharedTake) giveBack() {
	if s.taken {
		s.bucket.giveBackAt(s.now, 1)
		s.taken = false
	}
}
