package pool

import (
	"sync"
	"time"

	"dnsproxi/guard"
)

// hedgeTick is the least a hedger sleeps: hedges due within it of one
// another go out together, so a flood wakes it at most 1000 times a second
// and a hedge goes out at most this late, or, if sending the hedges due
// before it takes longer, as soon as they are sent.
const hedgeTick = time.Millisecond

// hedger sends the hedges of a pool from one goroutine: a waiting query is
// an entry in a queue, not a goroutine or a timer of its own. Every query
// is hedged the same delay after its send, so the queue is in the order the
// hedges come due, and the goroutine sleeps until the oldest one.
type hedger struct {
	mu    sync.Mutex
	queue []hedgeEntry // due in order from head
	head  int

	wake  chan struct{} // the queue was empty and is not
	stop  chan struct{}
	done  chan struct{}
	clock guard.Clock
	timer *time.Timer // the real clock's, reused
}

type hedgeEntry struct {
	x   *Exchange
	gen uint64
	due time.Time
}

// waiter is implemented by clocks that can wait (guard.ManualClock does):
// tests then drive the hedges by advancing the clock.
type waiter interface {
	After(d time.Duration) <-chan time.Time
}

func newHedger(c guard.Clock) *hedger {
	h := &hedger{
		wake:  make(chan struct{}, 1),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
		clock: c,
	}
	if _, ok := c.(guard.RealClock); ok || c == nil {
		h.clock = guard.RealClock{}
		h.timer = time.NewTimer(time.Hour)
		h.timer.Stop()
	}
	go h.run()
	return h
}

// add queues the hedge of x's use gen, due at due. Each query's due time
// counts from its caller's reading, and callers reach add a little out of
// the order they read the clock in: the entry goes back past any due after
// it (nearly always none, or one or two), so the queue stays in due order.
// When it lands at the head, the goroutine is woken to wait for it instead.
func (h *hedger) add(x *Exchange, gen uint64, due time.Time) {
	h.mu.Lock()
	h.queue = append(h.queue, hedgeEntry{})
	i := len(h.queue) - 1
	for ; i > h.head && h.queue[i-1].due.After(due); i-- {
		h.queue[i] = h.queue[i-1]
	}
	h.queue[i] = hedgeEntry{x, gen, due}
	first := i == h.head
	h.mu.Unlock()
	if first {
		select {
		case h.wake <- struct{}{}:
		default: // a wake is already pending
		}
	}
}

// close stops the goroutine; queued hedges are dropped (their queries end
// by their first attempts).
func (h *hedger) close() {
	close(h.stop)
	<-h.done
}

// run sends each hedge as it comes due, until close.
func (h *hedger) run() {
	defer close(h.done)
	var due []hedgeEntry
	// alarm is pending only while the queue holds entries, and rings at
	// alarmAt, for the head. An entry that becomes the head wakes the
	// goroutine, which sets the alarm again if that head is due sooner.
	var alarm <-chan time.Time
	var alarmAt time.Time
	for {
		var wait time.Duration
		now := h.clock.Now()
		due, wait = h.takeDue(now, due[:0])
		// The alarm is set before the hedges due are sent: their sends take
		// time, and the next hedge's wait counts from now, not from after them.
		if at := now.Add(wait); wait > 0 && (alarm == nil || at.Before(alarmAt)) {
			alarm, alarmAt = h.after(wait), at
		}
		for i, e := range due {
			e.x.hedge(e.gen, e.due, now)
			due[i] = hedgeEntry{} // keep no Exchange alive
		}
		select {
		case <-h.stop:
			return
		case <-h.wake:
		case <-alarm:
			alarm = nil
		}
	}
}

// takeDue moves the entries due at now to out and returns how long to
// sleep before the next one (at least hedgeTick), or 0 if none is left.
func (h *hedger) takeDue(now time.Time, out []hedgeEntry) ([]hedgeEntry, time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for h.head < len(h.queue) && !h.queue[h.head].due.After(now) {
		out = append(out, h.queue[h.head])
		h.queue[h.head] = hedgeEntry{}
		h.head++
	}
	if h.head == len(h.queue) {
		h.queue, h.head = h.queue[:0], 0
		return out, 0
	}
	if h.head > len(h.queue)/2 { // reuse the front: the queue stays as long as the hedges in the air
		n := copy(h.queue, h.queue[h.head:])
		clear(h.queue[n:])
		h.queue, h.head = h.queue[:n], 0
	}
	return out, max(h.queue[h.head].due.Sub(now), hedgeTick)
}

// after returns a channel that fires after d, on the clock's own timers
// when it has them.
func (h *hedger) after(d time.Duration) <-chan time.Time {
	if h.timer != nil {
		h.timer.Reset(d) // since Go 1.23 a Reset timer never delivers a stale tick
		return h.timer.C
	}
	if w, ok := h.clock.(waiter); ok {
		return w.After(d)
	}
	return time.After(d)
}
