package main

import (
	"io"
	"log/slog"
	"testing"
)

// Every line offered lands in exactly one count, written or dropped, the
// lines offered after the log is closed too (a query answered as shutdown
// gives up waiting for it): they are never written, so they are dropped.
// Before, a line that found room in the buffer after close was in neither
// count: 10 lines before close and 100 after, with room for 64, counted
// 10 written and 36 dropped.
func TestLinesAfterCloseAreCountedDropped(t *testing.T) {
	tests := []struct {
		name          string
		before, after int
	}{
		{"room for all", 10, 20},
		{"beyond the buffer", 10, 100},
		{"none before", 0, 64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newQueryLog(io.Discard, nil, 1, 64, slog.New(slog.NewTextHandler(io.Discard, nil)))
			addLines(l, tt.before)
			closeQueryLog(t, l)
			addLines(l, tt.after)
			written, dropped := l.stats()
			if written != uint64(tt.before) || written+dropped != uint64(tt.before+tt.after) {
				t.Fatalf("%d lines before close, %d after: %d written + %d dropped, want %d written and %d in all",
					tt.before, tt.after, written, dropped, tt.before, tt.before+tt.after)
			}
		})
	}
}
