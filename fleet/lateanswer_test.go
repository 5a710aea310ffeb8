package fleet

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"dnsproxi/guard"
)

// What a relay does with the bytes it carries.
const (
	relayPass      int32 = iota // both ways at once
	relayLate                   // commands at once; a script's reply held back lateBy
	relayBlackHole              // commands swallowed: Redis never sees them
)

// lateBy is how long relayLate holds a reply: far past any timeout the
// tests give the limiter, so the call has given up when it comes.
const lateBy = 500 * time.Millisecond

// relay is a TCP hop on loopback in front of a Redis: the network between
// an instance and Redis, made slow or lossy on demand.
type relay struct {
	ln   net.Listener
	mode atomic.Int32
	done chan struct{}
	wg   sync.WaitGroup
}

// startRelay relays every connection made to it to the Redis at target
// (host:port) until the test ends.
func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{ln: ln, done: make(chan struct{})}
	t.Cleanup(func() {
		close(r.done)
		ln.Close()
		r.wg.Wait()
	})
	r.wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				client.Close()
				continue
			}
			r.wg.Go(func() { r.carry(client, server) })
		}
	})
	return r
}

// carry relays one connection until either side closes or the test ends.
func (r *relay) carry(client, server net.Conn) {
	var once sync.Once
	closeBoth := func() { once.Do(func() { client.Close(); server.Close() }) }
	defer closeBoth()
	ended := make(chan struct{})
	go func() {
		select {
		case <-r.done:
		case <-ended:
		}
		closeBoth()
	}()
	defer close(ended)
	// Once a script went to Redis in relayLate, every reply on the
	// connection is late: go-redis's handshake (HELLO) still answers in
	// time, so the script is sent and runs, and only its answer is late.
	var late atomic.Bool
	var inner sync.WaitGroup
	inner.Go(func() { // commands
		defer closeBoth()
		buf := make([]byte, 64<<10)
		for {
			n, err := client.Read(buf)
			mode := r.mode.Load()
			if n > 0 && mode != relayBlackHole {
				if mode == relayLate && bytes.Contains(bytes.ToLower(buf[:n]), []byte("\r\neval")) {
					late.Store(true)
				}
				if _, werr := server.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	inner.Go(func() { // replies
		defer closeBoth()
		buf := make([]byte, 64<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 {
				if late.Load() {
					select {
					case <-time.After(lateBy): // the network delivers it late
					case <-r.done:
						return
					}
				}
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	inner.Wait()
}

// url is a redis:// URL that reaches Redis through the relay.
func (r *relay) url() string { return "redis://" + r.ln.Addr().String() + "/0" }

// waitBucketBelow waits until the shared bucket holds at most v tokens: a
// call the relay let through has run on Redis.
func waitBucketBelow(t *testing.T, r *redisServer, v float64) float64 {
	t.Helper()
	c := r.client()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		got, err := c.HGet(ctx, fleetKeys(DefaultKey)[0], "tokens").Float64()
		cancel()
		if err == nil && got <= v {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bucket holds %v (%v) after 5 s, want at most %v: the call never ran on Redis", got, err, v)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// spendLocally lets the limiter, in local mode, spend n tokens from its
// local bucket, its manual clock moved on far enough to hold them.
func spendLocally(t *testing.T, l *Limiter, clock interface{ Advance(time.Duration) }, n int, rate float64) {
	t.Helper()
	if l.Mode() != ModeLocal {
		t.Fatalf("mode %v, want local", l.Mode())
	}
	clock.Advance(time.Duration(float64(n)/rate*float64(time.Second)) + time.Second)
	for i := range n {
		if !l.Allow(1) {
			t.Fatalf("the local bucket refused token %d of %d", i+1, n)
		}
	}
}

// TestLateAnswerChargesTheDebtOnce: a call carries the tokens an instance
// spent from its local share; Redis runs it (the debt comes off the shared
// bucket) but its answer arrives after the timeout. The next call must not
// charge that debt again, or the fleet pays twice for one local spending
// and a slow path to Redis drains the bucket every other instance leases
// from. And a call Redis never saw (swallowed on the way) must leave its
// debt to the next one: the debt is charged exactly once either way.
func TestLateAnswerChargesTheDebtOnce(t *testing.T) {
	const rate, debt = 1.0, 100 // 1/s: Redis's clock refills about nothing meanwhile
	for _, tt := range []struct {
		name string
		mode int32
	}{
		{"answer after the timeout", relayLate},
		{"call never reaches Redis", relayBlackHole},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := startRedis(t)
			hop := startRelay(t, fmt.Sprintf("127.0.0.1:%d", r.s.Port))
			clock := guard.NewManualClock(time.Unix(1_700_000_000, 0))
			l, err := newLimiter(Config{URL: hop.url(), Rate: rate, Burst: 1000, Timeout: 50 * time.Millisecond, Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				close(l.done) // no goroutine to close it
				l.Close()
			})
			if l.Mode() != ModeShared {
				t.Fatalf("mode %v through the relay, want shared", l.Mode())
			}

			// Redis is cut off: the instance goes local and spends there.
			hop.mode.Store(relayBlackHole)
			clock.Advance(checkInterval)
			l.step(clock.Now())
			spendLocally(t, l, clock, debt, rate)
			before := bucketTokens(t, r)

			// The call carrying the debt: run late, or never.
			hop.mode.Store(tt.mode)
			calls := l.RedisCalls()
			clock.Advance(checkInterval)
			l.step(clock.Now())
			if got := l.RedisCalls(); got.Timeout != calls.Timeout+1 {
				t.Fatalf("calls %+v then %+v: want one more timed out", calls, got)
			}
			if tt.mode == relayLate {
				waitBucketBelow(t, r, before-debt+2) // it ran: the debt is off the bucket
			}

			// Redis is fast again: the next call answers in time.
			hop.mode.Store(relayPass)
			clock.Advance(checkInterval)
			l.step(clock.Now())
			if l.Mode() != ModeShared {
				t.Fatalf("mode %v after Redis answered in time, want shared", l.Mode())
			}
			after := bucketTokens(t, r)
			// Each call grants at most one token (the largest block at 1/s);
			// Redis refills one a second. The debt, charged once: 100.
			fell := before - after
			t.Logf("the bucket fell by %.2f (%.2f → %.2f) for a local spending of %d; calls %+v", fell, before, after, debt, l.RedisCalls())
			if fell > debt+2+0.01 {
				t.Errorf("the bucket fell by %.2f for a local spending of %d: the debt was charged more than once", fell, debt)
			}
			if fell < debt-5 {
				t.Errorf("the bucket fell by %.2f for a local spending of %d: the debt was not charged", fell, debt)
			}
		})
	}
}
