package main

import (
	"context"
	"log/slog"
	"sync"
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
// Lines go through a queue of asyncLogQueue to a goroutine of their own;
// when the queue is full a line is dropped and counted, never waited for.
type asyncLog struct {
	queue   chan asyncLine // never closed: a late line is queued or dropped, never a panic
	dropped atomic.Uint64
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
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

// newAsyncLog starts the writer of log's lines and returns a logger that
// queues them.
func newAsyncLog(log *slog.Logger) (*asyncLog, *slog.Logger) {
	a := &asyncLog{queue: make(chan asyncLine, asyncLogQueue), stop: make(chan struct{}), done: make(chan struct{})}
	go a.run()
	return a, slog.New(&asyncHandler{inner: log.Handler(), log: a})
}

func (a *asyncLog) run() {
	defer close(a.done)
	for {
		select {
		case l := <-a.queue:
			l.h.Handle(context.Background(), l.r)
		case <-a.stop:
			for { // what was queued before the stop
				select {
				case l := <-a.queue:
					l.h.Handle(context.Background(), l.r)
				default:
					return
				}
			}
		}
	}
}

// Close stops the writer once it has written what is queued, waiting at
// most asyncLogStopWait. A line logged after is dropped.
func (a *asyncLog) Close() {
	a.once.Do(func() { close(a.stop) })
	select {
	case <-a.done:
	case <-time.After(asyncLogStopWait):
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
	select {
	case h.log.queue <- asyncLine{h.inner, r.Clone()}:
	default:
		h.log.dropped.Add(1)
	}
	return nil
}

func (h *asyncHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &asyncHandler{inner: h.inner.WithAttrs(attrs), log: h.log}
}

func (h *asyncHandler) WithGroup(name string) slog.Handler {
	return &asyncHandler{inner: h.inner.WithGroup(name), log: h.log}
}
