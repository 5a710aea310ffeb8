package guard

// Each benchmark runs ours beside the anchor doing the same work, so one
// `go test -bench . ./guard/` gives honest ratios from the same run.

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/sony/gobreaker/v2"
	"golang.org/x/time/rate"
)

// A rate so high the bucket never empties: we measure the gate, not refusals.
const benchRate = 1e12

func BenchmarkTokenBucketAllow(b *testing.B) {
	b.Run("guard", func(b *testing.B) {
		tb := NewTokenBucket(benchRate, math.MaxInt32, RealClock{})
		b.ReportAllocs()
		for b.Loop() {
			tb.Allow(1)
		}
	})
	b.Run("x-time-rate", func(b *testing.B) {
		l := rate.NewLimiter(benchRate, math.MaxInt32)
		b.ReportAllocs()
		for b.Loop() {
			l.Allow()
		}
	})
	b.Run("guard-parallel", func(b *testing.B) {
		tb := NewTokenBucket(benchRate, math.MaxInt32, RealClock{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				tb.Allow(1)
			}
		})
	})
	b.Run("x-time-rate-parallel", func(b *testing.B) {
		l := rate.NewLimiter(benchRate, math.MaxInt32)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l.Allow()
			}
		})
	})
}

func BenchmarkTokenBucketWaitN(b *testing.B) {
	ctx := context.Background()
	b.Run("guard", func(b *testing.B) {
		tb := NewTokenBucket(benchRate, math.MaxInt32, RealClock{})
		b.ReportAllocs()
		for b.Loop() {
			_ = tb.WaitN(ctx, 1)
		}
	})
	b.Run("x-time-rate", func(b *testing.B) {
		l := rate.NewLimiter(benchRate, math.MaxInt32)
		b.ReportAllocs()
		for b.Loop() {
			_ = l.WaitN(ctx, 1)
		}
	})
}

// BenchmarkBreakerAllowClosed is one guarded call in the closed state:
// Allow then MarkSuccess, against gobreaker's two-step Allow then done(true).
func BenchmarkBreakerAllowClosed(b *testing.B) {
	b.Run("guard", func(b *testing.B) {
		br := NewBreaker(BreakerConfig{}, RealClock{})
		b.ReportAllocs()
		for b.Loop() {
			if br.Allow() == nil {
				br.MarkSuccess()
			}
		}
	})
	b.Run("guard-permit", func(b *testing.B) {
		br := NewBreaker(BreakerConfig{}, RealClock{})
		b.ReportAllocs()
		for b.Loop() {
			if p, err := br.Acquire(); err == nil {
				p.Success()
			}
		}
	})
	b.Run("gobreaker", func(b *testing.B) {
		cb := gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{})
		b.ReportAllocs()
		for b.Loop() {
			if done, err := cb.Allow(); err == nil {
				done(nil)
			}
		}
	})
	b.Run("guard-parallel", func(b *testing.B) {
		br := NewBreaker(BreakerConfig{}, RealClock{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if br.Allow() == nil {
					br.MarkSuccess()
				}
			}
		})
	})
	b.Run("gobreaker-parallel", func(b *testing.B) {
		cb := gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if done, err := cb.Allow(); err == nil {
					done(nil)
				}
			}
		})
	})
}

var errBench = errors.New("bench failure")

// BenchmarkBreakerMarkFailure records failures that never trip the breaker
// (threshold 100% with one success in the window), from every core at once.
func BenchmarkBreakerMarkFailure(b *testing.B) {
	b.Run("guard-single", func(b *testing.B) {
		br := NewBreaker(BreakerConfig{FailThreshold: 1}, RealClock{})
		br.MarkSuccess()
		b.ReportAllocs()
		for b.Loop() {
			br.MarkFailure()
		}
	})
	b.Run("guard", func(b *testing.B) {
		br := NewBreaker(BreakerConfig{FailThreshold: 1}, RealClock{})
		br.MarkSuccess()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				br.MarkFailure()
			}
		})
	})
	b.Run("gobreaker", func(b *testing.B) {
		cb := gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
			ReadyToTrip: func(gobreaker.Counts) bool { return false },
		})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if done, err := cb.Allow(); err == nil {
					done(errBench)
				}
			}
		})
	})
}

// BenchmarkBreakerCancel ends permits with nothing to report (a slow name's
// timeout, shutdown) on a closed breaker: Acquire and Cancel touch no lock.
func BenchmarkBreakerCancel(b *testing.B) {
	b.Run("guard-single", func(b *testing.B) {
		br := NewBreaker(BreakerConfig{}, RealClock{})
		b.ReportAllocs()
		for b.Loop() {
			if p, err := br.Acquire(); err == nil {
				p.Cancel()
			}
		}
	})
	b.Run("guard-parallel", func(b *testing.B) {
		br := NewBreaker(BreakerConfig{}, RealClock{})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if p, err := br.Acquire(); err == nil {
					p.Cancel()
				}
			}
		})
	})
}
