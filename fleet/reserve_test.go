package fleet

import (
	"context"

	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// duringCall runs f before every command the client sends: what Allow does
// while a call is on its way to Redis.
type duringCall struct{ f func() }

func (h duringCall) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h duringCall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h duringCall) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.f()
		return next(ctx, cmd)
	}
}

// bucketTokens reads the shared bucket's tokens as the script left them.
func bucketTokens(t *testing.T, r *redisServer) float64 {
	t.Helper()
	v, err := r.client().HGet(context.Background(), fleetKeys(DefaultKey)[0], "tokens").Float64()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestReturnedTokenSpentDuringTheCallIsCharged: an idle instance gives back
// its expiring reserve in the call that renews it; a query that takes that
// token while the call is on its way has spent a token the bucket got back,
// and the next call must charge it, or the fleet spends it twice.
func TestReturnedTokenSpentDuringTheCallIsCharged(t *testing.T) {
	r := startRedis(t)
	// 0.001/s: Redis's own clock refills nothing during the test.
	l, clock := steppedLimiter(t, r, Config{Rate: 0.001, Burst: 1})
	if l.Mode() != ModeShared || l.LeaseTokens() != 1 {
		t.Fatalf("mode %v, lease %d: want shared with the bucket's one token", l.Mode(), l.LeaseTokens())
	}
	spentDuring := 0
	l.rdb.AddHook(duringCall{func() {
		if l.Allow(1) {
			spentDuring++
		}
	}})
	clock.Advance(leaseLife - expiryMargin + 10*time.Millisecond) // the reserve is about to expire
	before := l.callsMade()
	l.step(clock.Now())
	if l.callsMade() != before+1 || spentDuring != 1 {
		t.Fatalf("calls %d, spent during the call %d: want one renewing call and the token spent during it", l.callsMade()-before, spentDuring)
	}
	if got := l.spentLocal.Load(); got != 1 {
		t.Fatalf("after the renewal the debt to charge is %d, want 1 (the returned token that was spent)", got)
	}
	// The bucket: 1 token, granted, given back, granted again: 0 now, and
	// the next call charges the spent one (not below empty), leaving the
	// fleet with nothing but the token in hand.
	if got := bucketTokens(t, r); got > 0.01 {
		t.Fatalf("bucket holds %v after the renewal, want 0", got)
	}
	clock.Advance(checkInterval)
	l.step(clock.Now())
	if got := l.spentLocal.Load(); got != 0 {
		t.Fatalf("the next call left a debt of %d uncharged", got)
	}
	if held := l.LeaseTokens(); held > 1 {
		t.Fatalf("the instance holds %d tokens of a bucket of 1", held)
	}
}

// TestIdleStarvedInstanceDoesNotPoll: an idle instance whose reserve the
// bucket cannot fill (another holds its only token) calls Redis about once
// a second, not every minGap; a query refused meanwhile makes it ask at
// once.
func TestIdleStarvedInstanceDoesNotPoll(t *testing.T) {
	r := startRedis(t)
	holder, _ := steppedLimiter(t, r, Config{Rate: 0.001, Burst: 1})
	if holder.LeaseTokens() != 1 {
		t.Fatalf("the first instance holds %d, want the bucket's one token", holder.LeaseTokens())
	}
	l, clock := steppedLimiter(t, r, Config{Rate: 0.001, Burst: 1})
	if l.LeaseTokens() != 0 || l.Mode() != ModeShared {
		t.Fatalf("mode %v, lease %d: want shared and nothing granted", l.Mode(), l.LeaseTokens())
	}
	before := l.callsMade()
	const seconds = 10
	for range seconds * 100 {
		clock.Advance(10 * time.Millisecond)
		l.step(clock.Now())
	}
	if calls := l.callsMade() - before; calls > seconds+1 {
		t.Errorf("an idle instance refused its reserve made %d calls in %d s, want about one a second", calls, seconds)
	}
	clock.Advance(10 * time.Millisecond)
	if l.Allow(1) {
		t.Fatal("allowed with nothing in hand and an empty bucket")
	}
	before = l.callsMade()
	clock.Advance(minGap)
	l.step(clock.Now())
	if l.callsMade() != before+1 {
		t.Errorf("a refused query did not make the starved instance ask within minGap")
	}
}
