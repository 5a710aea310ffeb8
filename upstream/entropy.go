package upstream

import (
	crand "crypto/rand"
	"encoding/binary"
	"math/rand/v2"
)

// reseedAfter is how many draws an entropy serves between two keys from
// the kernel: about 2,000 queries (an ID and a word of 0x20 case each).
const reseedAfter = 4096

// entropy is the cryptographically strong source of the bits an off-path
// spoofer must guess: message IDs and the case of the name's letters. It is
// a ChaCha8 stream (math/rand/v2's CSPRNG, which erases its key as it goes,
// so one output does not reveal earlier ones) keyed from crypto/rand and
// keyed again every reseedAfter draws, so that a state read out of memory
// predicts only the next few thousand values.
//
// Why not crypto/rand for every draw: it costs a getrandom system call,
// about 140 ns for the 16 bytes of one query here against about 30 ns from
// ChaCha8 (BenchmarkEntropy), and the draw is made under the socket's lock.
//
// It is not safe for concurrent use: the socket or connection that owns one
// guards it with its mutex. The zero value is ready and keys itself on the
// first draw.
type entropy struct {
	rng  rand.ChaCha8
	left int // draws before the next key
}

// uint64 returns 64 random bits.
func (e *entropy) uint64() uint64 {
	if e.left <= 0 {
		var seed [32]byte
		crand.Read(seed[:]) // never fails (it crashes the program instead, as of Go 1.24)
		e.rng.Seed(seed)
		e.left = reseedAfter
	}
	e.left--
	return e.rng.Uint64()
}

// cryptoUint64 returns 64 bits from crypto/rand, for the rare draws (a
// source port per socket) that need no speed.
func cryptoUint64() uint64 {
	var b [8]byte
	crand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:])
}
