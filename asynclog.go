package main

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"
)

// asyncLog writes the log lines of goroutines that must never wait for
// stderr: an upstream's reply reader or sweeper, which make a breaker's
// transitions and notice an upstream that drops 0x20, and a query's own
// goroutine. A stderr that stalls (a pipe whose reader stopped, a journald
// that lags) held the goroutine that logged: a reply reader that logged a
// breaker's opening never came back, and every query sent on its socket
// waited out its timeout (TestAttackStalledStderrDoesNotStopTheUpstreamsReplies).
// Lines go through a queue of asyncLogQueue to a writer goroutine, started
// by a line that finds none running and gone once the queue is empty (the
// events are rare: nothing runs between them); when the queue is full a
// line is dropped and counted, never waited for.
type asyncLog struct {
	queue   chan asyncLine
	running atomic.Bool   // a writer goroutine is draining the queue
	idle    chan struct{} // a writer left (capacity 1)
	stopped atomic.Bool   // Close has begun: lines are dropped
	dropped atomic.Uint64
}

// asyncLine is one record and the handler it is for.
type asyncLine struct {
	h slog.Handler
	r slog.Record
}

// asyncLogQueue is how many lines wait for a stalled stderr before more
// are dropped: the events logged this way are a breaker's transitions and
// a few warnings, a handful a minute.
const asyncLogQueue = 256

// asyncLogStopWait is how long Close waits for the queued lines to be
// written: a stderr still stalled then loses them, and the process stops.
const asyncLogStopWait = time.Second

// newAsyncLog returns a logger that queues log's lines for a writer of
// their own.
func newAsyncLog(log *slog.Logger) (*asyncLog, *slog.Logger) {
	a := &asyncLog{queue: make(chan asyncLine, asyncLogQueue), idle: make(chan struct{}, 1)}
	return a, slog.New(&asyncHandler{inner: log.Handler(), log: a})
}

// add queues l and makes sure a writer runs.
func (a *asyncLog) add(l asyncLine) {
	if a.stopped.Load() {
		a.dropped.Add(1)
		return
	}
	select {
	case a.queue <- l:
	default:
		a.dropped.Add(1)
		return
	}
	if a.running.CompareAndSwap(false, true) {
		go a.write()
	}
}

// write drains the queue, then leaves. A line queued as it leaves finds
// running false and starts the next writer, or is taken by this one going
// on: no line is left behind.
func (a *asyncLog) write() {
	for {
		select {
		case l := <-a.queue:
			l.h.Handle(context.Background(), l.r)
			continue
		default:
		}
		a.running.Store(false)
		if len(a.queue) == 0 || !a.running.CompareAndSwap(false, true) {
			select {
			case a.idle <- struct{}{}:
			default:
			}
			return
		}
	}
}

// Close drops every line logged from now on and waits, at most
// asyncLogStopWait, for the writer to write what is queued.
func (a *asyncLog) Close() {
	a.stopped.Store(true)
	deadline := time.NewTimer(asyncLogStopWait)
	defer deadline.Stop()
	for a.running.Load() {
		select {
		case <-a.idle:
		case <-deadline.C:
			return
		}
	}
}

// Dropped returns how many lines were dropped on a full queue.
func (a *asyncLog) Dropped() uint64 { return a.dropped.Load() }

// asyncHandler is the slog.Handler of an asyncLog's logger.
type asyncHandler struct {
	inner slog.Handler
	log   *asyncLog
}

func (h *asyncHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

// Handle queues r, or drops it when the queue is full.
func (h *asyncHandler) Handle(_ context.Context, r slog.Record) error {
	h.log.add(asyncLine{h.inner, r.Clone()})
	return nil
}

func (h *asyncHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &asyncHandler{inner: h.inner.WithAttrs(attrs), log: h.log}
}

func (h *asyncHandler) WithGroup(name string) slog.Handler {
	return &asyncHandler{inner: h.inner.WithGroup(name), log: h.log}
}
