package main

import (
	"testing"
	"unsafe"
)

// A flight goes back to flightPool with its joiners slice as long as the
// largest crowd it ever carried: after one crowd of maxFollowers it keeps
// room for 64 waiters, each with a whole question, for as long as traffic
// keeps it in circulation. Over a long run every flight in circulation (up
// to DNS_MAX_INFLIGHT and the flights answered at once) meets a crowd once,
// and the pool holds that many 64-waiter slices where the README bounds the
// followers waiting in all at DNS_MAX_INFLIGHT + 512. The answer buffers keep
// no more than maxKeptBuf for that reason (answer.go, cached.go).
func TestSoakRecycledFlightKeepsNoCrowd(t *testing.T) {
	f := new(flight)
	for range maxFollowers {
		f.joiners = append(f.joiners, waiter{})
	}
	f.recycle()
	kept := cap(f.joiners) * int(unsafe.Sizeof(waiter{}))
	if kept > maxKeptBuf {
		t.Fatalf("a flight back in the pool after a crowd of %d keeps room for %d waiters, %d bytes; want at most %d",
			maxFollowers, cap(f.joiners), kept, maxKeptBuf)
	}
}
