package main

import (
	"io"
	"log/slog"
	"math/big"
	"math/rand/v2"
	"testing"
)

// words returns a draw that reads ws, then zeros.
func words(ws ...uint64) func() uint64 {
	return func() uint64 {
		if len(ws) == 0 {
			return 0
		}
		w := ws[0]
		ws = ws[1:]
		return w
	}
}

// A share too small for one 64-bit word still keeps a line: the least
// draw (a uniform real of 0) is below any share above 0, so it keeps one.
// Before, a share below 2^-64 (about 5.4e-20) was the threshold 0, which
// no draw is below: DNS_QUERY_LOG_SAMPLE=1e-20 was accepted and kept
// nothing. The least float64, 2^-1074, is kept by a draw just below it
// (1074 = 16·64 + 50: sixteen zero words, then 2^14-1, the 50th bit of the next being 2^14) and not by one at it.
func TestTinySampleKeepsSomeLines(t *testing.T) {
	for _, share := range []float64{5e-324, 1e-300, 1e-20, 5.4e-20, 0x1p-65, 0x1p-64} {
		l := newQueryLog(io.Discard, nil, share, 16, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if !l.sample.keep(words()) {
			t.Errorf("DNS_QUERY_LOG_SAMPLE=%g: the least draw keeps no line: none ever will", share)
		}
		if l.sample.keep(words(1)) && share < 0x1p-64 {
			t.Errorf("DNS_QUERY_LOG_SAMPLE=%g: a draw of 2^-64 kept the line", share)
		}
		closeQueryLog(t, l)
	}
	least := make([]uint64, 17)
	least[16] = 1<<14 - 1
	if s := newSampler(5e-324); !s.keep(words(least...)) {
		t.Error("2^-1074: a draw just below it did not keep the line")
	}
	least[16]++
	if s := newSampler(5e-324); s.keep(words(least...)) {
		t.Error("2^-1074: a draw of it kept the line")
	}
}

// A draw keeps a line exactly when, read as a real in [0, 1), it is below
// the share, however many of the share's digits it takes to tell: checked
// against exact rational arithmetic for draws at, just below and just
// above each share, and random ones.
func TestSampleKeepsExactlyBelowTheShare(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, share := range []float64{0.25, 0.01, 1.0 / 3, 1 - 0x1p-53, 0x1p-64, 1e-20, 1e-300, 5e-324, 0.1 * 0x1p-70} {
		s := newSampler(share)
		exact := new(big.Rat).SetFloat64(share)
		near := [][]uint64{append([]uint64(nil), s.share...)}
		for i := range s.share {
			for _, d := range []uint64{1, ^uint64(0)} { // +1 and -1 at each word
				w := append([]uint64(nil), s.share...)
				w[i] += d
				near = append(near, w[:i+1])
			}
		}
		for range 100 {
			near = append(near, []uint64{r.Uint64(), r.Uint64()})
		}
		for _, draw := range near {
			// The draw's digits read as the interval [lo, lo + 2^-64k).
			lo := new(big.Rat)
			for i, w := range draw {
				lo.Add(lo, new(big.Rat).SetFrac(new(big.Int).SetUint64(w), new(big.Int).Lsh(big.NewInt(1), uint(64*(i+1)))))
			}
			hi := new(big.Rat).Add(lo, new(big.Rat).SetFrac(big.NewInt(1), new(big.Int).Lsh(big.NewInt(1), uint(64*len(draw)))))
			var want bool
			switch {
			case hi.Cmp(exact) <= 0:
				want = true
			case lo.Cmp(exact) >= 0:
				want = false
			default:
				continue // the share lies inside: more digits decide
			}
			if got := s.keep(words(draw...)); got != want {
				t.Errorf("share %g, draw %x: kept %v, want %v", share, draw, got, want)
			}
		}
	}
	if s := newSampler(1); !s.keep(words()) || s.share != nil {
		t.Error("share 1 does not keep every line without a draw")
	}
}
