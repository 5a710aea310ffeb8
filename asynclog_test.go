package main

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Lines logged through an asyncLog reach stderr in order, with the
// logger's attributes, all of them by the time Close returns.
func TestAsyncLogWritesInOrder(t *testing.T) {
	out := &syncBuffer{}
	a, log := newAsyncLog(slog.New(slog.NewTextHandler(out, nil)))
	l := log.With("upstream", "u1")
	for i := range 10 {
		l.Info("line", "i", i)
	}
	a.Close()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 10 {
		t.Fatalf("%d lines written, want 10:\n%s", len(lines), out)
	}
	for i, line := range lines {
		if !strings.Contains(line, "upstream=u1") || !strings.HasSuffix(line, " i="+string(rune('0'+i))) {
			t.Fatalf("line %d: %q", i, line)
		}
	}
	l.Info("after Close") // dropped or queued, never a panic or a wait
}

// With stderr stalled, a logger's caller never waits: past the queue, lines
// are dropped and counted; Close gives up after asyncLogStopWait; and a
// line logged after Close does not panic.
func TestAsyncLogNeverWaitsForAStalledStderr(t *testing.T) {
	stderr := &stallWriter{}
	stderr.stall()
	defer stderr.release()
	a, log := newAsyncLog(slog.New(slog.NewTextHandler(stderr, nil)))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range asyncLogQueue + 100 {
			log.Warn("breaker", "i", i)
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("logging waited for a stalled stderr")
	}
	// One line is with the writer (stalled in Write), asyncLogQueue wait
	// in the queue: the rest were dropped.
	if d := a.Dropped(); d < 99 || d > 100 {
		t.Fatalf("%d lines dropped of %d, want 99 or 100", d, asyncLogQueue+100)
	}
	start := time.Now()
	a.Close()
	if took := time.Since(start); took < asyncLogStopWait {
		t.Fatalf("Close returned after %v with stderr stalled, want it to wait %v for the queued lines", took, asyncLogStopWait)
	}
	log.Warn("after Close")
}
