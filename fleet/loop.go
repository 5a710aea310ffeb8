package fleet

// One goroutine per limiter does everything that touches Redis: it asks for
// the next block before the lease runs out, keeps the membership fresh,
// checks Redis about once a second, and moves between shared and local mode.
// Allow never waits for it: a block late in coming is refused in shared
// mode, and a call that fails or runs past the timeout switches the instance
// to its local share.
//
//   - A block is asked when the lease falls below half the last block's size,
//     sized to about 200 ms of the demand seen since the previous call (what
//     Allow spent plus what it could not serve), at least 1 and at most a
//     tenth of a second of the fleet's rate (and the burst). Half a block is
//     then 100 ms of demand still in hand when the next is asked: more than
//     minGap and a Redis round trip, and enough for a goroutine that a busy
//     machine lets run only every few tens of milliseconds. After a refusal
//     (the lease ran dry: the load grew faster than the demand seen) the
//     next block is the largest a block may be.
//   - No block is smaller than the reserve: reserveSpan of the instance's
//     share of the rate (the fleet's ÷ the instances last seen), at least 1
//     token, at most the largest block. An idle instance keeps it in hand,
//     renewed as it expires, so a load that starts at once — after a quiet
//     spell, right after a call, while the goroutine waits for a core — is
//     served from it until the block sized to that load arrives (minGap, a
//     round trip and the goroutine's lag: about 100 ms on a busy machine).
//     With the rate far above the load (the reserve at 1e7/s is 100,000
//     tokens, 2 s of 50,000/s) the lease runs dry only for a goroutine late
//     by about a second. It costs the rate nothing: an instance that spent
//     nothing since its last call gives back, in the call that renews it,
//     what its expiring blocks still hold (what it spends of them while the
//     call runs is charged to its next call), so the same tokens are leased
//     again rather than new ones, and the bucket's refill goes to the
//     instances that spend it. (Only a full bucket loses what comes back.)
//   - A block about to expire (within expiryMargin) counts as gone: the next
//     is asked for while it can still be spent. A goroutine that runs later
//     than that asks before it cuts the expired block, never after.
//   - Calls are at least minGap apart, so an instance makes at most
//     1 s / minGap calls a second whatever its demand or its luck; with no
//     demand, one a second keeps the membership fresh, and the reserve's
//     renewal adds one per leaseLife less expiryMargin (800 ms). An idle
//     instance that asked for its reserve and got nothing (the bucket was
//     empty) asks again a second later, or at once when a query comes: not
//     every minGap.
//   - In local mode, one call a second (asking for a block) is the health
//     check; the first answer returns the instance to shared mode.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"sync/atomic"
	"time"

	"dnsproxi/guard"
)

// ErrRedis is wrapped by the error of a Switch to local mode: a Redis call
// failed or ran past the timeout.
var ErrRedis = errors.New("fleet: redis call failed")

const (
	// checkInterval is how often Redis is called with no demand, and how
	// often local mode checks whether it is back.
	checkInterval = time.Second
	// minGap is the least time between two calls: at most 1s/minGap calls a second.
	minGap = 60 * time.Millisecond
	// demandHorizon is how much of the recent demand one block covers.
	demandHorizon = 200 * time.Millisecond
	// maxBlockSpan bounds a block: at most this much of the fleet's rate.
	maxBlockSpan = 100 * time.Millisecond
	// reserveSpan is the least a block holds: this much of the instance's
	// share of the rate.
	reserveSpan = 10 * time.Millisecond
	// expiryMargin is how long before a block expires the lease is judged
	// by what outlives it: the next block is asked for while the old one can
	// still be spent, so an expiry never leaves the lease dry for a round trip.
	expiryMargin = 100 * time.Millisecond
)

// callResult indexes Limiter.calls.
type callResult int

const (
	callOK callResult = iota
	callError
	callTimeout
	callResults
)

// loopState is the goroutine's bookkeeping.
type loopState struct {
	lastCall    time.Time // when the last call was sent
	lastOK      time.Time // when the last call Redis answered in time was sent
	demand      int64     // tokens wanted since lastCall
	unmet       int64     // of which refused: the lease ran dry
	block       int64     // the size of the next block to ask for
	maxBlock    int64
	everShared  bool
	starved     bool // the last call asked, was granted nothing, and nothing was wanted since the call before
	switches    atomic.Uint64
	hasReported bool
	// owed is what the next call settles: the local spending and the
	// returns that no answered call has carried, and the totals for the
	// ledger on Redis.
	owed settlement

	// The largest fleet seen lately, for a local share: right after Redis
	// restarts empty (or loses its keys), the instances come back one by
	// one and see fleets of 1, 2, ... until every one has called, and a
	// share of those counts, taken if Redis dies again then, would let the
	// fleet spend many times the rate. A count seen within membershipLife
	// of shared mode is one that may still hold (call renews it on the
	// way back from local mode).
	peak   int64
	peakAt time.Time
}

// seen notes a fleet of n instances counted at now.
func (s *loopState) seen(n int64, now time.Time) {
	if n >= s.peak || now.Sub(s.peakAt) > membershipLife {
		s.peak, s.peakAt = n, now
	}
}

// start makes New's first call and reports the mode it leaves the limiter in.
func (s *loopState) start(l *Limiter, now time.Time) {
	s.maxBlock = l.s.largestBlock()
	s.block = l.s.reserve(0)
	rate, burst := l.s.part(l.s.Fallback)
	l.local.Store(guard.NewTokenBucket(rate, burst, l.s.Clock))
	l.mode.Store(int32(ModeLocal))
	l.lease.low.Store(1)
	if err := l.call(now); err != nil {
		s.report(l, Switch{From: ModeStarting, To: ModeLocal, Rate: rate, Err: err})
	}
}

// run is the limiter's goroutine.
func (l *Limiter) run() {
	defer close(l.done)
	var timer *time.Timer
	for {
		wait := l.step(l.now())
		var fire <-chan time.Time
		if tc, ok := l.s.Clock.(interface {
			After(time.Duration) <-chan time.Time
		}); ok && !isReal(l.s.Clock) {
			fire = tc.After(wait)
		} else {
			if timer == nil {
				timer = time.NewTimer(wait)
				defer timer.Stop()
			} else {
				timer.Reset(wait)
			}
			fire = timer.C
		}
		select {
		case <-l.stop:
			return
		case <-l.wake:
		case <-fire:
		}
	}
}

// isReal reports whether c is the wall clock.
func isReal(c guard.Clock) bool {
	_, ok := c.(guard.RealClock)
	return ok
}

// step does what is due at now, at most one Redis call, and returns how long
// until something else is due.
func (l *Limiter) step(now time.Time) time.Duration {
	s := &l.loop
	local := Mode(l.mode.Load()) == ModeLocal
	if !local {
		// Cleared before the lease is read: a shortage after this wakes the
		// goroutine, one before it is seen below. (In local mode Allow finds
		// the lease empty every time; the once-a-second call clears it.)
		l.asking.Store(false)
	}
	unmet := l.unmet.Swap(0)
	s.demand += l.lease.spent() + unmet
	s.unmet += unmet
	since := now.Sub(s.lastCall)
	pace := !s.starved || s.demand > 0 // an idle instance refused its reserve does not poll
	if since >= checkInterval || (!local && pace && l.short(now) && since >= minGap) {
		_ = l.call(now) // a failure is reported through the switch
		now = l.now()
	}
	// Blocks are cut once the next is in hand: a goroutine that runs late,
	// after the block being spent expired, asks first, so the lease is not
	// dry for the call's round trip. (short counts an expired block as gone.)
	l.lease.expire(now)
	due := s.lastCall.Add(checkInterval)
	if Mode(l.mode.Load()) == ModeShared && (!s.starved || s.demand > 0) && l.short(now) {
		due = s.lastCall.Add(minGap)
	}
	if t, ok := l.lease.nextExpiry(); ok {
		if pre := t.Add(-expiryMargin); pre.After(now) && pre.Before(due) {
			due = pre // judge the lease by what outlives this block
		} else if t.Before(due) {
			due = t // cut it
		}
	}
	return max(due.Sub(now), 0)
}

// short reports whether the lease is below its low-water mark, counting
// only the blocks that outlive the next expiryMargin.
func (l *Limiter) short(now time.Time) bool {
	return l.lease.heldAfter(now.Add(expiryMargin)) < l.lease.low.Load()
}

// call asks Redis for a block (or only refreshes the membership when the
// lease is full enough), then updates the lease and the mode. It returns
// why Redis did not answer, the password redacted.
func (l *Limiter) call(now time.Time) error {
	s := &l.loop
	idle := s.demand == 0 && s.unmet == 0
	s.sizeBlock(now, l.s.reserve(int(l.fleet.Load())))
	l.asking.Store(false) // from here on, a new shortage wakes the goroutine again
	want := int64(0)
	if Mode(l.mode.Load()) != ModeShared || l.short(now) {
		want = s.block
	}
	s.lastCall = now

	s.owed.add(l.spentLocal.Swap(0), 0)
	// An idle instance gives back what its expiring blocks still hold, and
	// cuts them after the call.
	margin := now.Add(expiryMargin)
	returned := int64(0)
	if idle && Mode(l.mode.Load()) == ModeShared {
		returned = l.lease.unspentBy(margin)
	}
	s.owed.add(0, returned)

	l.begun.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), l.s.Timeout)
	stands := !s.lastOK.IsZero() && now.Sub(s.lastOK) < bucketSure
	reply, err := callLease(ctx, l.rdb, l.keys, l.s.Rate, l.s.Burst, want, l.member, s.owed, stands)
	cancel()
	l.calls[classify(err)].Add(1)
	if returned > 0 {
		// Cut whether Redis answered or not: a call that ran past the
		// timeout may have given them back. What Allow took of them while
		// the call ran was spent and given back: the next call charges it.
		if spent := returned - l.lease.expire(margin); spent > 0 {
			l.spentLocal.Add(spent)
		}
	}
	if err != nil {
		// The call may have run on Redis or not: the next one carries the
		// same debt and return again, and the ledger settles each once.
		err = l.redisError(err)
		l.toLocal(err)
		return err
	}
	s.owed.debt, s.owed.returned = 0, 0 // settled
	s.lastOK = now
	s.starved = want > 0 && reply.granted == 0 && idle
	l.fleet.Store(int64(reply.instances))
	if Mode(l.mode.Load()) == ModeLocal {
		// Back from local mode: the time spent there said nothing of the
		// fleet's size, and the others come back one by one. The count from
		// before holds for another membership's life while they do, however
		// long Redis was gone.
		s.peakAt = now
	}
	s.seen(int64(reply.instances), now)
	l.lease.low.Store((s.block + 1) / 2)
	l.lease.add(reply.granted, now.Add(leaseLife))
	s.everShared = true
	if from := Mode(l.mode.Load()); from != ModeShared {
		if !s.hasReported {
			from = ModeStarting
		}
		l.local.Store(nil)
		l.mode.Store(int32(ModeShared))
		s.report(l, Switch{From: from, To: ModeShared, Instances: reply.instances})
	}
	return nil
}

// largestBlock is maxBlockSpan of the fleet's rate, at most the burst, at
// least 1.
func (s *settings) largestBlock() int64 {
	return int64(max(1, min(math.Ceil(s.Rate*maxBlockSpan.Seconds()), float64(s.Burst))))
}

// reserve is the least block: reserveSpan of the share of the rate for a
// fleet of instances (as for 1 before Redis has answered), from 1 to the
// largest block.
func (s *settings) reserve(instances int) int64 {
	share, _ := s.share(instances)
	return int64(min(max(math.Ceil(share*reserveSpan.Seconds()), 1), float64(s.largestBlock())))
}

// sizeBlock sets the next block to about demandHorizon of the demand seen
// since the last call, within [least, maxBlock], and starts a new count.
func (s *loopState) sizeBlock(now time.Time, least int64) {
	window := max(now.Sub(s.lastCall), minGap)
	if s.lastCall.IsZero() {
		window = checkInterval
	}
	perSecond := float64(s.demand) / window.Seconds()
	s.block = int64(min(max(math.Ceil(perSecond*demandHorizon.Seconds()), float64(least)), float64(s.maxBlock)))
	if s.unmet > 0 {
		// Refused queries mean the last block was too small — a load that
		// grew faster than the demand seen, a ramp after a quiet spell: ask
		// for the most a block may be. The script grants no more than the
		// bucket's share for this instance, so the fleet stays fair.
		s.block = s.maxBlock
	}
	s.demand, s.unmet = 0, 0
}

// toLocal moves a shared-mode limiter to a local bucket holding its share of
// the rate, starting empty: the tokens it had were the fleet's. A limiter
// already local stays as it is.
func (l *Limiter) toLocal(why error) {
	s := &l.loop
	if Mode(l.mode.Load()) != ModeShared {
		return
	}
	instances := int(l.fleet.Load())
	if !s.peakAt.IsZero() && l.now().Sub(s.peakAt) <= membershipLife {
		instances = max(instances, int(s.peak)) // the largest fleet that may still hold
	}
	rate, burst := l.s.share(instances)
	b := guard.NewTokenBucket(rate, burst, l.s.Clock)
	b.Allow(burst)
	l.local.Store(b)
	l.mode.Store(int32(ModeLocal))
	s.report(l, Switch{From: ModeShared, To: ModeLocal, Instances: instances, Rate: rate, Err: why})
}

// report tells OnSwitch and counts the switch (not the first report).
func (s *loopState) report(l *Limiter, sw Switch) {
	if s.hasReported {
		s.switches.Add(1)
	}
	s.hasReported = true
	if l.s.OnSwitch != nil {
		l.s.OnSwitch(sw)
	}
}

// redisError describes a failed call without the password.
func (l *Limiter) redisError(err error) error {
	kind := "failed"
	if classify(err) == callTimeout {
		kind = fmt.Sprintf("took longer than %v", l.s.Timeout)
	}
	return fmt.Errorf("%w: %s %s: %s", ErrRedis, l.s.server.shown, kind, redactSecret(err.Error(), l.s.server.password))
}

// classify sorts a call's error into a result.
func classify(err error) callResult {
	var ne net.Error
	switch {
	case err == nil:
		return callOK
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return callTimeout
	}
	return callError
}

// leave takes the instance out of the membership, so the others' shares
// grow at once rather than when its membership expires.
func (s *loopState) leave(l *Limiter) {
	if !s.everShared {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.s.Timeout)
	defer cancel()
	l.begun.Add(1)
	l.calls[classify(l.rdb.ZRem(ctx, l.keys[1], l.member).Err())].Add(1)
}
