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
//   - Both keys expire on their own once nobody calls: an absent bucket is a
//     full one, which is what it would have refilled to anyway.
//   - A call may carry a debt: the tokens its instance spent from its local
//     share while it could not reach Redis. They come off the bucket (not
//     below empty) before anything is granted: a Redis that paused, alive,
//     refilled the bucket meanwhile, and the fleet would otherwise spend that
//     refill on top of the local shares.
//
// Every key carries the same hash tag ({key}), so on Redis Cluster the
// script's keys share one slot. Instances configured with different rates
// or bursts on one key fight: the latest caller's figures apply.

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// leaseScript grants up to ARGV[3] tokens and refreshes the caller's membership.
// KEYS: bucket hash, members sorted set. ARGV: rate, burst, want, member id,
// membership life in milliseconds, debt, returned. Returns {granted, members}.
var leaseScript = redis.NewScript(`
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local life_ms = tonumber(ARGV[5])
local debt = tonumber(ARGV[6]) or 0
local returned = tonumber(ARGV[7]) or 0
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
local full_ms = math.ceil((burst - tokens) / rate * 1000) + 1000
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'ts', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], full_ms)
return {granted, members}
`)

// membershipLife is how long an instance counts in the fleet after its last
// call. Calls come at least about once a second, so a live instance never
// drops out, and a dead one stops counting within this.
const membershipLife = 3 * time.Second

// fleetKeys are the two keys the script touches, under one hash tag.
func fleetKeys(key string) []string {
	tag := "{" + key + "}"
	return []string{tag + ":bucket", tag + ":members"}
}

// leaseReply is what one call of the script returns.
type leaseReply struct {
	granted   int64
	instances int
}

// callLease runs the script once, asking for want tokens (0 only refreshes
// the membership), charging debt tokens spent locally and giving back
// returned unspent tokens, bounded by ctx.
func callLease(ctx context.Context, rdb redis.Scripter, keys []string, rate float64, burst int, want int64, member string, debt, returned int64) (leaseReply, error) {
	vals, err := leaseScript.Run(ctx, rdb, keys,
		strconv.FormatFloat(rate, 'g', -1, 64), burst, want, member, membershipLife.Milliseconds(), max(debt, 0), max(returned, 0)).Int64Slice()
	if err != nil {
		return leaseReply{}, err
	}
	if len(vals) != 2 || vals[0] < 0 || vals[0] > max(want, 0) || vals[1] < 1 {
		return leaseReply{}, fmt.Errorf("fleet: the lease script answered %v", vals)
	}
	return leaseReply{granted: vals[0], instances: int(vals[1])}, nil
}
