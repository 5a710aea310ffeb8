package wire

import "hash/maphash"

// MaxQuestionLen is the length of the longest question: a 255-byte name,
// its type and its class.
const MaxQuestionLen = 255 + 4

// The bits of a Key besides its question: what, in a query, changes the
// answer a resolver gives.
const (
	KeyRD   = 1 << iota // recursion desired: without it a resolver answers from its cache only
	KeyCD               // checking disabled: the answer may hold what validation would reject
	KeyDO               // DNSSEC OK: the answer carries signatures
	KeyEDNS             // the query had an OPT record at all: sizes and extended RCODEs differ
)

// Key identifies a query by what its answer depends on: the name without
// regard to case, the type and class, and the Key* bits. Coalescing uses
// it, and so can a cache: it depends on nothing of the proxy's. Setting one
// and comparing two allocate nothing; Hash is a 64-bit hash of it under a
// seed chosen at start-up, so senders cannot aim at one bucket.
type Key struct {
	Hash uint64
	n    int
	b    [MaxQuestionLen + 1]byte // the question, name lower-cased, then the bits
}

var keySeed = maphash.MakeSeed()

// Set makes k the key of question (a query's bytes from the header's end to
// the question's) with bits. It reports false, leaving k unusable, for a
// question too short or too long to be one.
func (k *Key) Set(question []byte, bits byte) bool {
	if len(question) < 5 || len(question) > MaxQuestionLen {
		k.n = 0
		return false
	}
	name := len(question) - 4
	for i, c := range question[:name] {
		k.b[i] = lower(c) // a length byte is never a letter
	}
	copy(k.b[name:], question[name:])
	k.b[len(question)] = bits
	k.n = len(question) + 1
	k.Hash = maphash.Bytes(keySeed, k.b[:k.n])
	return true
}

// Equal reports whether k and o are the key of the same query.
func (k *Key) Equal(o *Key) bool {
	return k.Hash == o.Hash && k.n == o.n && string(k.b[:k.n]) == string(o.b[:o.n]) // a memory compare, no allocation
}

// Bytes returns what k compares: the question with its name lower-cased,
// then the bits. It aliases k, so a cache can keep a copy to tell two keys
// with one Hash apart without holding a whole Key.
func (k *Key) Bytes() []byte { return k.b[:k.n] }
