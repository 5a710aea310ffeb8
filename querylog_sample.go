package main

import (
	"encoding/binary"
	"math"
	"math/big"
)

// sampler draws the query log lines DNS_QUERY_LOG_SAMPLE keeps: each with
// a probability of exactly the share, down to the least positive float64
// (about 4.9e-324). It holds the share's binary expansion in 64-bit words,
// most significant first, and a draw reads random words as the digits of
// a uniform real in [0, 1) until one differs from the share's: that one
// decides. The first word decides all but once in 2^64 draws, so a line
// costs one random number, as before. (Before, the share was one word,
// share·2^64 truncated: below 2^-64, about 5.4e-20, it was 0, accepted at
// start-up and never keeping a line, TestTinySampleKeepsSomeLines.)
type sampler struct {
	share []uint64 // the share's words; nil: every line is kept
}

// newSampler returns the sampler of share; one at or above 1, or not above
// 0 (Sample's zero value), keeps every line.
func newSampler(share float64) sampler {
	if !(share > 0 && share < 1) {
		return sampler{}
	}
	frac, exp := math.Frexp(share)            // share = frac·2^exp, frac in [0.5, 1), exp ≤ 0
	mant := uint64(math.Ldexp(frac, 53))      // a 53-bit integer: share = mant / 2^(53-exp), exactly
	last := 53 - exp                          // the share's last digit is this many bits after the point
	words := (last + 63) / 64                 // 1 for 0.01, 17 for the least float64
	v := new(big.Int).SetUint64(mant)         // share = v / 2^(64·words) once shifted
	v.Lsh(v, uint(64*words-last))             // exact: a shift
	buf := v.FillBytes(make([]byte, 8*words)) // v < 2^(64·words): it fits
	s := sampler{share: make([]uint64, words)}
	for i := range s.share {
		s.share[i] = binary.BigEndian.Uint64(buf[8*i:])
	}
	for len(s.share) > 1 && s.share[len(s.share)-1] == 0 { // the zeros after the last 1 decide nothing
		s.share = s.share[:len(s.share)-1]
	}
	return s
}

// keep draws whether a line is kept, reading random words from draw.
func (s sampler) keep(draw func() uint64) bool {
	if s.share == nil {
		return true
	}
	for _, w := range s.share {
		if r := draw(); r != w {
			return r < w
		}
	}
	return false // the draw's digits so far are the share's: the draw is no less
}
