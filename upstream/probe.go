package upstream

import (
	"errors"
	"sync/atomic"
	"time"

	"dnsproxi/internal/wire"
)

// The probe series that decides whether the upstream echoes case: the rules
// and what they cost a spoofer are in case.go.

// How long a probe waits: probeRTTs times the quickest exact reply, within
// [minProbeWait, Timeout]; while no exact reply is known, probeRTTs times
// the quickest reply in another case, within [Timeout/probeWaitShare,
// Timeout]; Timeout/probeWaitShare while no reply is known. The floor
// absorbs the scheduling of the socket's reader.
const (
	probeRTTs       = 4
	minProbeWait    = time.Millisecond
	probeWaitShare  = 10
	quickestPeriod  = 30 * time.Second // the sweeper starts a new period of quickest replies this often
	fallbackLetters = 2                // a known question with fewer letters cannot tell case apart: localhost instead
)

// localhostQuestion is "localhost. A IN" in wire form: the probe's question
// before the upstream has answered any other exactly.
var localhostQuestion = []byte("\x09localhost\x00\x00\x01\x00\x01")

// quickest keeps the quickest exact reply of the current period and of the
// last period that had one, in nanoseconds (0: none). Every exact reply
// offers its reply time (one atomic load, a compare-and-swap only when it
// is the quickest); the sweeper starts a new period. The zero value is ready.
type quickest struct {
	cur, prev atomic.Int64
}

// add offers one reply time.
func (q *quickest) add(d time.Duration) {
	d = max(d, 1) // 0 means none
	for {
		old := q.cur.Load()
		if old != 0 && int64(d) >= old {
			return
		}
		if q.cur.CompareAndSwap(old, int64(d)) {
			return
		}
	}
}

// roll starts a new period; a period with no reply leaves the last one's.
func (q *quickest) roll() {
	if c := q.cur.Swap(0); c != 0 {
		q.prev.Store(c)
	}
}

// get returns the quickest reply of the two periods, and whether there is one.
func (q *quickest) get() (time.Duration, bool) {
	c, p := q.cur.Load(), q.prev.Load()
	switch {
	case c == 0 && p == 0:
		return 0, false
	case c == 0:
		return time.Duration(p), true
	case p == 0:
		return time.Duration(c), true
	}
	return time.Duration(min(c, p)), true
}

// probeWait is how long a probe waits for its reply, given the quickest
// exact reply (exactOK: whether there is one), the quickest reply in
// another case (foldedOK: the same) and the query timeout. An exact reply
// needs the case, so no forger can lower it; a reply in another case can
// be forged, so it may only lengthen the wait past a tenth of the timeout,
// never shorten it: a forged one, quick, would end each probe before the
// upstream's exact reply came to overrule the forger's
// (TestAttackForgedFoldedReplySetsTheProbeWindow).
func probeWait(exact time.Duration, exactOK bool, folded time.Duration, foldedOK bool, timeout time.Duration) time.Duration {
	switch {
	case exactOK:
		return min(max(probeRTTs*exact, minProbeWait), timeout)
	case foldedOK:
		return min(max(probeRTTs*folded, timeout/probeWaitShare), timeout)
	}
	return timeout / probeWaitShare
}

// startProbe starts a probe series, unless one is under way.
func (u *Upstream) startProbe() {
	if !u.cases.probing.CompareAndSwap(false, true) {
		return
	}
	u.cases.changed.Store(0)
	u.sendProbe(u.probeQuery())
}

// probeQuery returns a query, recursion desired, for a question the
// upstream answered exactly, or for localhost if it has answered none.
func (u *Upstream) probeQuery() []byte {
	q := make([]byte, wire.HeaderLen, wire.HeaderLen+64)
	wire.SetFlags(q, wire.FlagRD)
	wire.SetCounts(q, 1, 0, 0, 0)
	for _, sl := range u.socks {
		// Appended past len(q): a question that will not do is left there, unseen.
		if k := sl.cur.Load().appendKnownQuestion(q); len(k) > len(q)+4 && letters(k[len(q):len(k)-4]) >= fallbackLetters {
			return k
		}
	}
	return append(q, localhostQuestion...)
}

// sendProbe sends query as a probe: its outcome goes to probeDone. A probe
// Config.AllowExtra refuses is not sent, and the series ends as if it had
// no reply: it proves nothing, and the next suspect starts another.
func (u *Upstream) sendProbe(query []byte) {
	qend, ok := wire.QuestionEnd(query)
	if !ok || u.closed.Load() || !u.allowExtra() {
		u.cases.probing.Store(false)
		return
	}
	exact, exactOK := u.cases.quickest.get()
	folded, foldedOK := u.cases.folded.get()
	now := time.Now()
	c := newCall(u, query, qend, u.probeDone, now, now.Add(probeWait(exact, exactOK, folded, foldedOK, u.cfg.Timeout)))
	c.probe = true
	u.cases.probes.Add(1)
	u.sendUDP(c, now)
}

// probeDone weighs one probe's outcome: see the rules in case.go.
func (u *Upstream) probeDone(query, _ []byte, err error) {
	if !errors.Is(err, errCaseChanged) { // exact: the upstream echoes case; an error: no verdict
		u.cases.probing.Store(false)
		return
	}
	if u.cases.changed.Add(1) >= caseProbes {
		u.switchToPlainCase()
		return // probing stays set: no probe ever again
	}
	u.sendProbe(query)
}

// switchToPlainCase turns 0x20 off for good and sends the suspect queries
// again in the caller's case: they had their one reply already. Each
// re-send is paid (extra.go); one refused ends with ErrLimited.
func (u *Upstream) switchToPlainCase() {
	if u.cases.plain.Swap(true) {
		return
	}
	if fn := u.cfg.OnCaseFallback; fn != nil {
		u.background(fn)
	}
	var again []*call
	for _, sl := range u.socks {
		again = sl.takeSuspects(again)
	}
	now := time.Now()
	for _, c := range again {
		if err := u.extraSend(c); err != nil { // not paid (extra.go)
			c.finishAt(now, nil, err)
			continue
		}
		u.cases.resends.Add(1)
		u.sendUDP(c, now)
	}
}
