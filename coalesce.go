package main

import (
	"sync"
	"time"

	"dnsproxi/cache"
	"dnsproxi/dnsserver"
	"dnsproxi/internal/wire"
	"dnsproxi/metrics"
	"dnsproxi/upstream"
)

// Coalescing: a query whose key (wire.Key: the name without case, type,
// class, RD, CD, DO, EDNS or not) matches one already at the upstream, over
// the same network, waits for that one's answer instead of asking again.
// Each waiter still gets its own answer, built for it (answer.go).
//
// A follower pays the entry gate like any query, but not the in-flight cap
// and not the breaker: it adds no call to the upstream, so it must neither
// take a place the cap keeps for calls nor take the half-open probe's place.
// Followers are bounded twice. Per flight, by maxFollowers: beyond it a
// query goes to the upstream on its own, through the cap and the breaker,
// one more call per maxFollowers+1 clients. In all, by the proxy's
// followerCap (followerBound): beyond it a query that would wait is answered
// at once as the cap answers (stale if cached, else REFUSED, outcome
// overloaded), not sent, for a crowd that filled it would otherwise be
// one call a query. Without it, followers filled the server's bound on
// unanswered queries (MaxUnanswered), and from then on the server dropped
// every query, cached names included
// (TestAttackSlowNameCrowdSilencesCachedAnswers).
//
// Never coalesced: UDP with TCP (a UDP leader may get a TC answer a TCP
// client cannot use). Zone transfers never reach this point. Queries with
// an EDNS Client Subnet option are coalesced like any other: the proxy's own
// OPT leaves the subnet out, so the upstream's answer cannot depend on it,
// and kept apart they were a switch any client could flip to undo
// coalescing (TestECSQueriesAreCoalesced).

// maxFollowers bounds the queries waiting on one flight besides its leader,
// and so the work one upstream answer sets off.
const maxFollowers = 64

// flightShards spreads the flights over locks, so readers on several cores
// seldom wait for one another; flightBuckets is the chains of one shard.
// Together 8,192 chains a network: about as many as the queries a server
// holds unanswered by default (10,000), so a chain is a flight or two.
const (
	flightShards  = 64
	flightBuckets = 128
)

// flight is one query at the upstream, with everyone waiting for its answer.
// Its leader is held in it, not beside it: a query no one joins, which is
// most of them, is one object to fetch when it starts and when it lands,
// and what both touch comes first.
type flight struct {
	p       *proxy
	next    *flight // the next in its chain of the table
	hash    uint64  // key.Hash, beside next: a walk along a chain reads one line a flight
	net     uint8   // index into proxy.flights: 0 UDP, 1 TCP
	shared  bool    // in the table: others may join until it lands
	fired   bool    // its client-response timer answered its waiters: no one joins; guarded by its shard's lock
	done    upstream.ResultAt
	joiners []waiter    // the waiters besides the leader; they join under the shard's lock
	cached  flightCache // its part in the answer cache (stale.go)
	query   []byte      // what is sent upstream
	lead    waiter      // the query that started it: waiter 0
	key     wire.Key
}

// waiting is how many wait for f's answer: its leader and its joiners.
func (f *flight) waiting() int { return 1 + len(f.joiners) }

// waiter returns waiter i of f: 0 is the leader, then the joiners in turn.
func (f *flight) waiter(i int) *waiter {
	if i == 0 {
		return &f.lead
	}
	return &f.joiners[i-1]
}

var flightPool = sync.Pool{New: func() any { return new(flight) }}

// flightTable is the flights of one network, by key hash: a fixed array
// of chains through flight.next, newest first, rather than a map, so that
// putting a flight in and taking it out is a pointer or two, not a map
// write and a map delete for every query.
type flightTable [flightShards]flightShard

type flightShard struct {
	mu    sync.Mutex
	heads [flightBuckets]*flight
}

func (t *flightTable) shard(hash uint64) *flightShard { return &t[hash%flightShards] }

// chain returns where the chain of flights with hash starts. It requires
// that sh.mu is held.
func (sh *flightShard) chain(hash uint64) **flight {
	return &sh.heads[hash/flightShards%flightBuckets]
}

// newFlight returns a flight with q's client as its leader. coalesce says
// whether q may share it; the key is set only then.
func (p *proxy) newFlight(w dnsserver.ResponseWriter, q *dnsserver.Query, qtype metrics.QTypeRow, start time.Time) (f *flight, coalesce bool) {
	f = flightPool.Get().(*flight)
	if f.done == nil {
		f.done = f.land // made once per flight, not once per query
	}
	f.p, f.next, f.hash, f.shared, f.fired = p, nil, 0, false, false
	f.net = 0
	if q.Net == "tcp" {
		f.net = 1
	}
	f.joiners = f.joiners[:0]
	f.lead.set(w, q, qtype, start, p.udpSize())
	var bits byte
	flags := wire.Flags(q.Wire)
	if flags&wire.FlagRD != 0 {
		bits |= wire.KeyRD
	}
	if flags&wire.FlagCD != 0 {
		bits |= wire.KeyCD
	}
	if q.EDNS.Present {
		bits |= wire.KeyEDNS
	}
	if q.EDNS.DO {
		bits |= wire.KeyDO
	}
	if !f.key.Set(q.Wire[wire.HeaderLen:q.QEnd], bits) {
		return f, false
	}
	f.hash = f.key.Hash
	return f, true
}

// joinResult is what join made of a query.
type joinResult uint8

const (
	notJoined  joinResult = iota // no flight to wait on: the query goes on
	joined                       // it waits on a flight, or was answered stale at once; f is recycled
	overloaded                   // a flight could take it, but followerCap waits already; f is the caller's
)

// followerBound is the proxy's bound on followers for the in-flight cap
// maxInflight: the server's bound on unanswered queries (maxUnanswered)
// less the cap's calls and followerRoom, kept for the queries answered
// at once, cache hits first. With the cap off, half the server's bound.
func followerBound(maxInflight int) int64 {
	if maxInflight == 0 {
		return unlimitedPending / 2
	}
	return int64(maxUnanswered(maxInflight)-maxInflight) - followerRoom
}

// followerRoom is what the server's bound keeps, beyond the cap's calls
// and the followers, for queries that are answered at once.
const followerRoom = 512

// takeFollower takes a place among the followers, if followerCap allows.
func (p *proxy) takeFollower() bool {
	if p.followerCap == 0 {
		return true
	}
	if p.followers.Add(1) > p.followerCap {
		p.followers.Add(-1)
		return false
	}
	return true
}

// releaseFollowers gives back the places of f's joiners, once they are answered.
func (p *proxy) releaseFollowers(f *flight) {
	if p.followerCap != 0 && len(f.joiners) > 0 {
		p.followers.Add(-int64(len(f.joiners)))
	}
}

// join adds f's leader to the flight with the same key, if one is in the
// air with room, and reports joined if it did; f is then recycled. If a
// flight could take it but the proxy's followers are at followerCap, it
// reports overloaded (at step 2 only: a query that reaches joinOrShare has
// passed the cap and the pool, and goes on as a call). A query
// that holds an expired entry to answer stale from (stale.go) joins only a
// flight that holds one too: a flight without one, a prefetch of the entry
// while it was fresh, answers its waiters SERVFAIL if it fails and arms no
// client-response timer, so the query would lose the stale answer it was
// owed. It refreshes on its own instead. One that finds only full flights
// refreshing its entry, or one whose client-response timer has answered
// its clients (stale.go) while the refresh is still out, gets its stale
// answer at once: the entry is being refreshed already, and a refresh of
// its own would make a flood of one expired name ask a dead upstream once
// per maxFollowers+1 clients, or once per DNS_CACHE_STALE_WAIT with every
// client waiting the timer out again.
func (p *proxy) join(f *flight) joinResult { return p.joinOr(f, false) }

// joinOrShare is join, and if f joins nothing it puts f in the table for
// others to join, first in its chain so that joiners find the newest
// flight (the one with room) first: in one step under the shard's lock, so
// that of identical queries that each found nothing to join at once (join
// comes before the gates, and f is shared only after them), one is shared
// and the others join it. It reports whether f joined (or was answered
// stale at once, as join does); f is then recycled. Flights with the same
// key may still stand side by side: one that filled up, or fired, and the
// one started beside it.
func (p *proxy) joinOrShare(f *flight) joinResult { return p.joinOr(f, true) }

func (p *proxy) joinOr(f *flight, share bool) joinResult {
	stale := f.cached.fallback.Stale()
	if share && stale && !p.cache.servable(f.cached.fallback) {
		// The entry left the stale window while f passed the cap and the
		// pool (step 5): f goes on as a query for a name not cached, and
		// is not answered stale at once below. (Step 2's join follows the
		// lookup at once.)
		f.cached.fallback, f.cached.refresh, stale = cache.Hit{}, false, false
	}
	refreshing := false // a full flight refreshes f's entry
	crowded := false    // a flight had room for f, the proxy had none
	sh := p.flights[f.net].shard(f.hash)
	sh.mu.Lock()
	head := sh.chain(f.hash)
	for g := *head; g != nil; g = g.next {
		if g.hash == f.hash && g.key.Equal(&f.key) {
			if g.fired { // its clients have their stale answers; the refresh is still out
				refreshing = refreshing || stale
				continue
			}
			if stale && !g.cached.fallback.Stale() {
				continue // it could not answer f stale
			}
			if len(g.joiners) >= maxFollowers {
				refreshing = refreshing || stale
				continue // full: a newer flight beside it may have room
			}
			if !p.takeFollower() {
				refreshing = refreshing || stale
				crowded = true
				continue
			}
			g.joiners = append(g.joiners, f.lead)
			sh.mu.Unlock()
			p.metrics.Coalesced.Inc()
			f.recycle()
			return joined
		}
	}
	if share && !refreshing {
		f.next, f.shared = *head, true
		*head = f
	}
	sh.mu.Unlock()
	switch {
	case refreshing:
		p.answerAtOnce(f, f.cached.fallback, metrics.Stale)
		f.recycle()
		return joined
	case crowded && !share:
		return overloaded
	}
	return notJoined
}

// fire marks f, in the table, as answered by its client-response timer:
// no one joins it from then on, so its waiters are the timer's alone, and
// a query for its name is answered stale at once while it is still out
// (join). It stays in the table until it lands.
func (p *proxy) fire(f *flight) {
	sh := p.flights[f.net].shard(f.hash)
	sh.mu.Lock()
	f.fired = true
	sh.mu.Unlock()
}

// unshare takes f out of the table: from then on f's waiters are the
// completion's alone.
func (p *proxy) unshare(f *flight) {
	sh := p.flights[f.net].shard(f.hash)
	sh.mu.Lock()
	for at := sh.chain(f.hash); *at != nil; at = &(*at).next {
		if *at == f {
			*at = f.next
			break
		}
	}
	sh.mu.Unlock()
}

// maxPooledJoiners is the most joiners' room a flight takes back into the
// pool: enough for the usual handful; a crowd's is let go.
const maxPooledJoiners = 16

// recycle returns f to the pool, keeping nobody's writer alive.
func (f *flight) recycle() {
	f.lead.w = nil
	for i := range f.joiners {
		f.joiners[i].w = nil
	}
	f.joiners = f.joiners[:0]
	if cap(f.joiners) > maxPooledJoiners {
		f.joiners = nil // a crowd's room (368 bytes a waiter) is not kept in the pool
	}
	f.p, f.next = nil, nil
	f.cached = flightCache{} // holds no cache entry alive in the pool
	flightPool.Put(f)
}
