package fleet

import (
	"testing"
	"time"

	"dnsproxi/guard"
)

// steppedLimiter is a limiter on r whose goroutine never runs: the test
// moves the manual clock and calls step itself, so every Redis call happens
// at a time the test chose.
func steppedLimiter(t *testing.T, r *redisServer, c Config) (*Limiter, *guard.ManualClock) {
	t.Helper()
	clock := guard.NewManualClock(time.Unix(1_700_000_000, 0))
	c.URL, c.Clock = r.url(), clock
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Second // a slow test machine is not a Redis outage here
	}
	l, err := newLimiter(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(l.done) // no goroutine to close it
		l.Close()
	})
	return l, clock
}

// calls is the number of Redis calls l made, whatever their result.
func (l *Limiter) callsMade() uint64 {
	c := l.RedisCalls()
	return c.OK + c.Error + c.Timeout
}

// TestStepCallsPerSecond: offered 10,000 tokens a second (ten every
// millisecond) for ten seconds of the manual clock, far below the fleet's
// rate, an instance calls Redis at most 20 times a second and serves
// nearly all of it from leases.
func TestStepCallsPerSecond(t *testing.T) {
	r := startRedis(t)
	l, clock := steppedLimiter(t, r, Config{Rate: 1e6, Burst: 1e6})
	const seconds, perMs = 10, 10
	before := l.callsMade()
	serverBefore := scriptCalls(t, r.client())
	var offered, admitted int
	for range seconds * 1000 {
		clock.Advance(time.Millisecond)
		for range perMs {
			offered++
			if l.Allow(1) {
				admitted++
			}
		}
		l.step(clock.Now())
	}
	calls := l.callsMade() - before
	server := scriptCalls(t, r.client()) - serverBefore
	t.Logf("%d calls (server counted %d scripts) in %d s; admitted %d of %d; mode %v", calls, server, seconds, admitted, offered, l.Mode())
	if l.Mode() != ModeShared || l.RedisCalls().Error+l.RedisCalls().Timeout != 0 {
		t.Fatalf("mode %v, calls %+v: Redis was expected to answer every call", l.Mode(), l.RedisCalls())
	}
	if perSecond := float64(calls) / seconds; perSecond > 20 {
		t.Errorf("%.1f Redis calls a second, want at most 20", perSecond)
	}
	if server > int64(calls)+1 { // one NOSCRIPT retry with EVAL at most
		t.Errorf("the server ran %d scripts for %d calls", server, calls)
	}
	if admitted < offered*99/100 {
		t.Errorf("admitted %d of %d with the fleet's rate far above: the lease came too late", admitted, offered)
	}
}

// TestStepIdle: with no demand, about one call a second keeps the
// membership, and the instance holds one token, no more, so the first query
// after a quiet spell need not wait for a call.
func TestStepIdle(t *testing.T) {
	r := startRedis(t)
	l, clock := steppedLimiter(t, r, Config{Rate: 100})
	start := l.callsMade()
	for range 5000 {
		clock.Advance(time.Millisecond)
		l.step(clock.Now())
	}
	// The token lives 900 ms, and is renewed when it expires.
	if calls := l.callsMade() - start; calls < 5 || calls > 6 {
		t.Errorf("%d calls in 5 idle seconds, want 5 or 6", calls)
	}
	if got := l.LeaseTokens(); got != 1 {
		t.Errorf("an idle instance holds %d tokens, want 1", got)
	}
}

// TestStepLeaseExpires: tokens in hand are cut leaseLife after the call
// that got them was sent, not later.
func TestStepLeaseExpires(t *testing.T) {
	r := startRedis(t)
	l, clock := steppedLimiter(t, r, Config{Rate: 10_000})
	for range 500 { // demand: refused, since nothing is in hand yet
		l.Allow(1)
	}
	clock.Advance(minGap)
	sent := clock.Now()
	l.step(sent)
	held := l.LeaseTokens()
	if held <= 1 {
		t.Fatalf("%d tokens in hand after asking with demand waiting", held)
	}
	clock.Set(sent.Add(leaseLife - time.Millisecond))
	l.lease.expire(clock.Now())
	if got := l.LeaseTokens(); got != held {
		t.Fatalf("%d tokens in hand 1 ms before expiry, want %d", got, held)
	}
	clock.Set(sent.Add(leaseLife))
	l.lease.expire(clock.Now())
	if got := l.LeaseTokens(); got != 0 {
		t.Errorf("%d tokens in hand at expiry, want 0", got)
	}
}

// TestStepBlockSize: a block is never more than a tenth of a second of the
// fleet's rate, at least the reserve (TestReserve), and after refusals (here
// all the demand was refused: nothing was in hand) the largest a block may
// be. (Sized to 200 ms of served demand: TestStepKeepsUpWhenTheGoroutineLags.)
func TestStepBlockSize(t *testing.T) {
	cases := []struct {
		name      string
		rate      float64
		perSecond int
		wantBlock int64
	}{
		{"refused: the largest block", 100_000, 2000, 10_000},
		{"capped at 100 ms of the rate", 1000, 5000, 100},
		{"at least the reserve: 10 ms of the rate", 1000, 0, 10},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := startRedis(t)
			l, clock := steppedLimiter(t, r, Config{Rate: c.rate})
			// One second of demand, refused (nothing in hand), then the call.
			for range c.perSecond {
				l.Allow(1)
			}
			clock.Advance(time.Second)
			l.step(clock.Now())
			if l.loop.block != c.wantBlock {
				t.Errorf("block %d, want %d", l.loop.block, c.wantBlock)
			}
			if got := l.LeaseTokens(); got != c.wantBlock {
				t.Errorf("%d tokens in hand, want the block of %d", got, c.wantBlock)
			}
		})
	}
}

// TestStepKeepsUpWhenTheGoroutineLags: with the rate far above the load, a
// steady 10,000/s must never be refused, even when the limiter's goroutine
// gets to run only every 80 ms (a machine busy with the very load it
// limits). The lease must hold more than one lag of demand when the next
// block is asked for.
func TestStepKeepsUpWhenTheGoroutineLags(t *testing.T) {
	r := startRedis(t)
	l, clock := steppedLimiter(t, r, Config{Rate: 1e7})
	const perStep, lag = 800, 80 * time.Millisecond // 10,000/s
	refused := 0
	for step := range 60 {
		for range perStep {
			if !l.Allow(1) && step >= 3 { // the first steps learn the demand
				refused++
			}
		}
		clock.Advance(lag)
		l.step(clock.Now())
	}
	if refused > 0 {
		t.Fatalf("%d of %d queries refused at 10,000/s with a rate of 1e7/s and a goroutine lagging %v",
			refused, 57*perStep, lag)
	}
}

// TestStepRampAfterIdle: a load that starts at once after a quiet spell
// (a benchmark run, a client fleet reconnecting) is refused only until the
// first call answers. That call sees a second of near-zero demand; sized to
// it, the block would run dry at once and the load would be refused for
// another minGap. A refusal means the last block was too small: the next
// asks for the most a block may be.
func TestStepRampAfterIdle(t *testing.T) {
	r := startRedis(t)
	l, clock := steppedLimiter(t, r, Config{Rate: 1e7})
	for range 5 { // idle: one call a second keeps one token in hand
		clock.Advance(time.Second)
		l.step(clock.Now())
	}
	clock.Advance(990 * time.Millisecond)            // the goroutine sleeps until its next check, at 1 s
	const perStep, tick = 200, 10 * time.Millisecond // 20,000/s from nothing
	refused := 0
	for step := range 30 {
		for range perStep {
			if !l.Allow(1) && step >= 1 { // before the call at 1 s, only the token in hand
				refused++
			}
		}
		clock.Advance(tick)
		l.step(clock.Now())
	}
	if refused > 0 {
		t.Fatalf("%d of %d queries refused after the first call, at 20,000/s with a rate of 1e7/s", refused, 29*perStep)
	}
}

// TestStepNextBlockBeforeExpiry: under steady demand the next block is in
// hand before the one being spent expires, so the lease never runs dry at
// an expiry (it did: the block was asked for only once the old one was cut,
// and every query in the call's round trip was refused — some 300 a second
// at 20,000/s on a loaded machine).
func TestStepNextBlockBeforeExpiry(t *testing.T) {
	r := startRedis(t)
	l, clock := steppedLimiter(t, r, Config{Rate: 1e7})
	const perStep, tick = 200, 10 * time.Millisecond // 20,000/s
	dry := 0
	for step := range 400 { // 4 s: four leases' lives
		for range perStep {
			l.Allow(1)
		}
		clock.Advance(tick)
		l.lease.expire(clock.Now()) // what Allow would find right after the expiry, before any call
		if step >= 10 && l.lease.tokens.Load() == 0 {
			dry++
		}
		l.step(clock.Now())
	}
	if dry > 0 {
		t.Fatalf("the lease ran dry at %d of 390 steps: the next block came only after the last expired", dry)
	}
}
