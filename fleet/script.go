package fleet

// The shared bucket is one Lua script, so each lease is one atomic step on
// Redis, timed by Redis's own clock (TIME), never by the instances' clocks:
//
//   - The bucket (a hash: tokens, ts in microseconds) starts full and refills
//     lazily at rate per second up to burst, like guard.TokenBucket.
//   - A call asks for want tokens and is granted at most want, at most the
//     whole tokens held ÷ the instances counted (at least 1 while a whole
//     token is held): never more than the bucket holds, possibly 0. The
//     division keeps a starved fleet fair: calls from instances that drift
//     into step would otherwise leave the first caller of each round the
//     whole refill and the others crumbs.
//   - A clock that stepped back (a failover to another server) earns
//     nothing and is not waited for: ts moves to the new reading.
//   - The same call first refreshes the caller's membership in a sorted set scored
//     by expiry, drops the expired members and counts the rest, so the
//     fleet's size costs no extra round trip.
//   - Both keys expire on their own once nobody calls, the bucket
//     bucketLinger after it is full again: an absent bucket is a full one,
//     which is what it would have refilled to anyway — unless Redis lost it
//     (a restart quicker than a call, a failover to a replica that never
//     had it, an eviction, a flush), and a full one is then a second burst.
//     A caller whose last answered call was sent less than bucketSure ago
//     knows the bucket stood: it says so, and an absent bucket is made empty.
//   - A call may carry a debt: the tokens its instance spent from its local
//     share while it could not reach Redis. They come off the bucket (not
//     below empty) before anything is granted: a Redis that paused, alive,
//     refilled the bucket meanwhile, and the fleet would otherwise spend that
//     refill on top of the local shares.
//   - Debts and returns are settled once each, whatever became of the call
//     that carried them: a call that ran on Redis but whose answer came
//     after the timeout leaves its instance unsure, and the next call
//     carries the same tokens again. Each instance keeps a ledger on Redis
//     (its third key): the running totals of what it has owed and given
//     back, as its calls that ran carried them. A call carries its own
//     totals and what no answered call has carried yet; only the part of it
//     the ledger has not seen comes off (or goes back into) the bucket, so
//     the fleet never pays twice for one local spending.
//
// Every key carries the same hash tag ({key}), so on Redis Cluster the
// script's keys share one slot. Instances of an earlier version call their
// own script (another SHA) on the same bucket and membership, without a
// ledger: each version's calls keep their own accounting, and neither reads
// what only the other writes. Instances configured with different rates
// or bursts on one key fight: the latest caller's figures apply.

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// leaseScript grants up to ARGV[3] tokens and refreshes the caller's membership.
// KEYS: bucket hash, members sorted set, and (optional) the caller's ledger
// hash. ARGV: rate, burst, want, member id, membership life in
// milliseconds, debt and returned not yet settled, debt and returned in all,
// ledger life in milliseconds, the bucket's linger in milliseconds, and "1"
// when the caller knows the bucket stands. Returns {granted, members}.
var leaseScript = redis.NewScript(`
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local life_ms = tonumber(ARGV[5])
local debt = tonumber(ARGV[6]) or 0
local returned = tonumber(ARGV[7]) or 0
local debt_total = tonumber(ARGV[8])
local returned_total = tonumber(ARGV[9])
if KEYS[3] and debt_total and returned_total then
  local seen = redis.call('HMGET', KEYS[3], 'debt', 'returned')
  local seen_debt = tonumber(seen[1])
  local seen_returned = tonumber(seen[2])
  if seen_debt and seen_returned then
    debt = math.min(debt, math.max(0, debt_total - seen_debt))
    returned = math.min(returned, math.max(0, returned_total - seen_returned))
    debt_total = math.max(debt_total, seen_debt)
    returned_total = math.max(returned_total, seen_returned)
  end
  if debt_total > 0 or returned_total > 0 then
    redis.call('HSET', KEYS[3], 'debt', string.format('%.0f', debt_total), 'returned', string.format('%.0f', returned_total))
    redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[10]))
  end
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZADD', KEYS[2], string.format('%.0f', now + life_ms * 1000), ARGV[4])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[2], life_ms)
local members = redis.call('ZCARD', KEYS[2])
local held = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(held[1])
local ts = tonumber(held[2])
if tokens == nil or ts == nil then
  tokens, ts = burst, now
  if ARGV[12] == '1' then
    tokens = 0
  end
end
if now > ts then
  tokens = tokens + (now - ts) * rate / 1000000
end
if tokens > burst then
  tokens = burst
end
if debt > 0 then
  tokens = math.max(0, tokens - debt)
end
if returned > 0 then
  tokens = math.min(burst, tokens + returned)
end
local granted = 0
if want > 0 and tokens >= 1 then
  granted = math.min(want, math.max(1, math.floor(tokens / members)))
end
tokens = tokens - granted
local full_ms = math.ceil((burst - tokens) / rate * 1000) + (tonumber(ARGV[11]) or 1000)
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'ts', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], full_ms)
return {granted, members}
`)

// membershipLife is how long an instance counts in the fleet after its last
// call. Calls come at least about once a second, so a live instance never
// drops out, and a dead one stops counting within this.
const membershipLife = 3 * time.Second

// bucketLinger is how long the bucket outlives the moment it is full
// again, and bucketSure how long after a call was sent its instance can be
// sure the bucket stands: whatever the bucket held, it expires no sooner
// than bucketLinger after that call ran. An idle instance calls about once
// a second, within bucketSure of its last call.
const (
	bucketLinger = 3 * time.Second
	bucketSure   = bucketLinger / 2
)

// ledgerLife is how long an instance's ledger outlives its last call that
// ran on Redis: far longer than any answer is late while the instance
// still calls. A call that arrives later still than that finds no ledger
// and settles what it carries, which its instance's later calls may have
// settled already: at most that call's own debt, charged twice.
const ledgerLife = time.Minute

// fleetKeys are the bucket and the membership, under one hash tag.
func fleetKeys(key string) []string {
	tag := "{" + key + "}"
	return []string{tag + ":bucket", tag + ":members"}
}

// callKeys are the keys one instance's calls touch: fleetKeys and its
// ledger, under the same hash tag.
func callKeys(key, member string) []string {
	return append(fleetKeys(key), "{"+key+"}:ledger:"+member)
}

// leaseReply is what one call of the script returns.
type leaseReply struct {
	granted   int64
	instances int
}

// settlement is what a call settles with the bucket besides its grant: the
// tokens its instance spent from its local share (debt) and the unspent
// tokens it gave back (returned), each as what no answered call has carried
// yet, and in all since the instance started. Without a ledger key the
// script takes the first two as they are.
type settlement struct {
	debt, returned           int64 // not yet settled, as far as the instance knows
	debtTotal, returnedTotal int64 // in all: the ledger settles only what it has not seen
}

// add counts debt more tokens spent locally and returned more given back.
func (st *settlement) add(debt, returned int64) {
	st.debt += debt
	st.debtTotal += debt
	st.returned += returned
	st.returnedTotal += returned
}

// callLease runs the script once, asking for want tokens (0 only refreshes
// the membership) and settling st, bounded by ctx. stands says the caller
// knows the bucket is there: an absent one was lost, and is made empty.
func callLease(ctx context.Context, rdb redis.Scripter, keys []string, rate float64, burst int, want int64, member string, st settlement, stands bool) (leaseReply, error) {
	known := "0"
	if stands {
		known = "1"
	}
	vals, err := leaseScript.Run(ctx, rdb, keys,
		strconv.FormatFloat(rate, 'g', -1, 64), burst, want, member, membershipLife.Milliseconds(),
		max(st.debt, 0), max(st.returned, 0), max(st.debtTotal, 0), max(st.returnedTotal, 0), ledgerLife.Milliseconds(),
		bucketLinger.Milliseconds(), known).Int64Slice()
	if err != nil {
		return leaseReply{}, err
	}
	if len(vals) != 2 || vals[0] < 0 || vals[0] > max(want, 0) || vals[1] < 1 {
		return leaseReply{}, fmt.Errorf("fleet: the lease script answered %v", vals)
	}
	return leaseReply{granted: vals[0], instances: int(vals[1])}, nil
}
