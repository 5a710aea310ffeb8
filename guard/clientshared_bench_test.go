package guard

import (
	"net/netip"
	"testing"
	"time"
)

// The entry gates of one admitted query: the client's bucket then the
// shared one as two calls (which spent the client's token when the shared
// bucket refused), beside AllowWithAt, one token of each or none. Both
// buckets are far from empty: the hot path.
func BenchmarkAllowWithAt(b *testing.B) {
	addr := netip.MustParseAddr("127.0.0.1")
	build := func() (*ClientLimiter, *TokenBucket) {
		return NewClientLimiter(ClientLimiterConfig{Rate: 1e8, Burst: 1e8}, RealClock{}), NewTokenBucket(1e8, 1e8, RealClock{})
	}
	b.Run("two calls", func(b *testing.B) {
		l, shared := build()
		b.ReportAllocs()
		for b.Loop() {
			now := time.Now()
			if l.AllowAt(now, addr) {
				shared.AllowAt(now, 1)
			}
		}
	})
	b.Run("AllowWithAt", func(b *testing.B) {
		l, shared := build()
		b.ReportAllocs()
		for b.Loop() {
			l.AllowWithAt(time.Now(), addr, shared)
		}
	})
	b.Run("two calls parallel", func(b *testing.B) {
		l, shared := build()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				now := time.Now()
				if l.AllowAt(now, addr) {
					shared.AllowAt(now, 1)
				}
			}
		})
	})
	b.Run("AllowWithAt parallel", func(b *testing.B) {
		l, shared := build()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.AllowWithAt(time.Now(), addr, shared)
			}
		})
	})
}
