package main

import (
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/cache"
	"dnsproxi/guard"
	"dnsproxi/metrics"
	"dnsproxi/upstream"
)

// Serve-stale (RFC 8767). A query for an expired entry is a refresh: it
// goes to the upstream like any query, carrying the entry as its fallback.
// Its clients get the stale answer (TTL 30, EDE 3 or 19 when they sent EDNS,
// outcome stale) when:
//
//   - nothing can be sent: the in-flight cap is full, every breaker open,
//     or the outbound limit without a token (refusedFromCache, at the
//     refusals in handleQuery); the recheck timer is not started;
//   - the refresh fails: no usable answer came back — a failure as
//     upstream.Judge defines it, a reply that does not read, a SERVFAIL
//     answer, or a timeout Judge leaves uncounted (a slow name: not the
//     upstream's fault, but the client has no answer all the same). The
//     cache then holds the name for RecheckAfter (30 s), answering it stale
//     at once without asking, so a dead upstream is not asked name by name
//     — unless the refresh never left the process (upstream.NotSent: no
//     free message ID, a full send queue), which says nothing of the
//     upstream: the next query refreshes again;
//   - no answer came within DNS_CACHE_STALE_WAIT (the client-response
//     timer): the timer answers the clients, and the refresh goes on and
//     updates the entry when it lands.
//
// Each of these serves the entry later than the lookup that found it, by
// up to the stale wait or the refresh's round trip, so each checks the
// stale window (DNS_CACHE_STALE, RFC 8767's maximum stale timer) again at
// that moment: past it the clients get what they would without the entry
// (the refresh's outcome, the refusal's answer), never a stale answer.
//
// The timer and the completion race for the waiters: whichever claims them
// first answers them all, the other leaves them alone. Once the timer has
// claimed them the flight has two owners, and the last to finish recycles
// it; the completion, which must never wait, never waits for the timer.

// flightCache is what a flight carries for the cache. Its zero value: no
// refresh, no fallback.
type flightCache struct {
	fallback cache.Hit  // the expired entry, to answer stale from; zero (not Stale): none
	refresh  bool       // f refreshes a cached entry: expired, or prefetched
	wait     *staleWait // the client-response timer, once armed
	overTCP  bool       // the refresh asks over TCP: the entry's answer is too large for UDP
}

// refusedFromCache answers f, refused at the in-flight cap or the breaker,
// from the cache if it can, and reports whether it did (f is then
// recycled): a refresh of an expired entry is answered stale, a prefetch
// (whose client has its answer) ends quietly. Nothing was sent, so the
// name's recheck timer is not started: once the upstream admits queries
// again, the next query refreshes it.
func (p *proxy) refusedFromCache(f *flight) bool {
	if p.cache == nil || !f.cached.refresh {
		return false
	}
	stale := f.cached.fallback.Stale()
	if stale && !p.cache.servable(f.cached.fallback) {
		return false // past the window since f's lookup: the refusal's own answer
	}
	p.cache.refreshes.Count(metrics.RefreshRefused)
	if stale {
		p.writeCached(&f.lead, f.cached.fallback, metrics.Stale)
	}
	f.recycle()
	return true
}

// servable reports whether h, a stale fallback, may be answered now: its
// entry is still inside DNS_CACHE_STALE, RFC 8767's maximum stale timer,
// at the moment of serving. The lookup that found it may be the stale wait
// or a refresh's whole round trip ago, and the window may have ended
// since; the client then gets what it would get without the entry.
func (c *answerCache) servable(h cache.Hit) bool {
	return h.Stale() && c.store.Servable(h, c.clock.Now())
}

// armStaleWait starts f's client-response timer if f refreshes an expired
// entry. It is called before f is handed to the upstream, which may
// complete it at once.
func (p *proxy) armStaleWait(f *flight) {
	c := p.cache
	if c == nil || c.staleWait <= 0 || !f.cached.fallback.Stale() {
		return
	}
	sw := &staleWait{f: f, c: c, fallback: f.cached.fallback}
	sw.refs.Store(2)
	f.cached.wait = sw
	sw.start(c.clock, c.staleWait)
}

// settleCache is the cache's part of f's completion, before its waiters
// are answered: it stores a usable answer (valid, not SERVFAIL) or notes
// that the refresh failed, and reports whether the waiters get f's
// fallback, stale: only while its entry is inside the stale window.
//
// A refresh that ended with err before it left the process
// (upstream.NotSent: no free message ID, a full send queue) is counted
// refused, as one the cap or the breaker refused, and does not start the
// failure-recheck timer: the upstream did not fail, and 30 s of stale
// answers without asking would degrade a name whose upstream is healthy.
func (p *proxy) settleCache(f *flight, reply []byte, usable bool, err error) (stale bool) {
	c := p.cache
	if c == nil {
		return false
	}
	now := c.clock.Now()
	switch {
	case usable:
		err := c.store.Store(&f.key, reply, now)
		if f.cached.refresh {
			if err == nil {
				c.refreshes.Count(metrics.RefreshUpdated)
			} else {
				c.refreshes.Count(metrics.RefreshNotStored)
			}
		}
	case f.cached.fallback.Stale():
		failed := refreshFailure(err)
		if failed == metrics.RefreshFailed {
			f.cached.fallback.RefreshFailed(now) // the entry refreshed, not one stored meanwhile
		}
		c.refreshes.Count(failed)
		return c.store.Servable(f.cached.fallback, now)
	case f.cached.refresh:
		c.refreshes.Count(refreshFailure(err)) // a prefetch: the entry stays as it is
	}
	return false
}

// refreshFailure is how a refresh with no usable answer, ended with err,
// is counted: refused if it never left the process, else failed.
func refreshFailure(err error) metrics.RefreshResult {
	if upstream.NotSent(err) {
		return metrics.RefreshRefused
	}
	return metrics.RefreshFailed
}

// usableAnswer reports whether a reply read as ua (ok: it read) is an
// answer worth giving a client that has a stale one: anything but SERVFAIL.
func usableAnswer(ua *upstreamAnswer, ok bool) bool {
	return ok && ua.flags&0xF != dns.RcodeServerFailure
}

// claimWaiters reports whether f's completion answers its waiters. If the
// client-response timer claimed them first, the completion leaves them to
// it, gives up its share of f, and must not touch f again.
func (f *flight) claimWaiters() bool {
	sw := f.cached.wait
	if sw == nil {
		return true
	}
	if sw.claimed.CompareAndSwap(false, true) {
		sw.stop()
		return true
	}
	sw.release()
	return false
}

// staleWait is one refresh's client-response timer.
type staleWait struct {
	f        *flight
	c        *answerCache
	fallback cache.Hit     // f's, kept here: fire may not read f before it has claimed it
	claimed  atomic.Bool   // set by whichever answers the waiters: the timer or the completion
	refs     atomic.Int32  // owners of f once the timer has claimed: the timer and the completion
	timer    *time.Timer   // on the real clock
	stopped  chan struct{} // on another clock (a test's): closed by stop
}

// waitingClock is a clock with timers of its own, such as
// guard.ManualClock: the stale-wait timer waits on it in tests.
type waitingClock interface {
	After(d time.Duration) <-chan time.Time
}

// start arms the timer on clock.
func (sw *staleWait) start(clock guard.Clock, d time.Duration) {
	wc, ok := clock.(waitingClock)
	if _, real := clock.(guard.RealClock); real || !ok {
		sw.timer = time.AfterFunc(d, sw.fire)
		return
	}
	sw.stopped = make(chan struct{})
	fired := wc.After(d)
	go func() {
		select {
		case <-fired:
			sw.fire()
		case <-sw.stopped:
		}
	}()
}

// stop disarms the timer; the completion calls it once it has claimed the
// waiters.
func (sw *staleWait) stop() {
	if sw.timer != nil {
		sw.timer.Stop()
		return
	}
	close(sw.stopped)
}

// fire is the timer: if the completion has not claimed the waiters, it
// closes the flight to joiners (no one joins a flight whose clients are
// answered; a query for the name is answered stale at once while the
// refresh is out, coalesce.go) and answers every waiter stale.
func (sw *staleWait) fire() {
	if !sw.c.servable(sw.fallback) {
		// Past the stale window: no stale answer. The waiters stay the
		// completion's, and get what the refresh brings, as they would
		// without the entry.
		return
	}
	if !sw.claimed.CompareAndSwap(false, true) {
		return // the completion came first: f is not the timer's to touch
	}
	f := sw.f
	p := f.p
	if f.shared {
		p.fire(f)
	}
	for i := range f.waiting() {
		if wt := f.waiter(i); wt.w != nil {
			p.writeCached(wt, f.cached.fallback, metrics.Stale)
		}
	}
	p.releaseFollowers(f)
	sw.release()
}

// release gives up one owner's share of the flight; the last recycles it.
func (sw *staleWait) release() {
	if sw.refs.Add(-1) == 0 {
		sw.f.recycle()
	}
}
