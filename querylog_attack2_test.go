package main

import (
	"bytes"
	"io"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/metrics"
)

// fullDiskWriter is a file on a disk with room bytes left, as write(2)
// behaves on it: a write larger than the room writes what fits and fails
// with ENOSPC (os.File returns that count and the error), the next fails
// with nothing written, until room is made.
type fullDiskWriter struct {
	mu   sync.Mutex
	room int
	out  bytes.Buffer
}

func (w *fullDiskWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := min(len(p), w.room)
	w.out.Write(p[:n])
	w.room -= n
	if n < len(p) {
		return n, syscall.ENOSPC
	}
	return n, nil
}

func (w *fullDiskWriter) free(room int) {
	w.mu.Lock()
	w.room += room
	w.mu.Unlock()
}

func (w *fullDiskWriter) text() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.out.String()
}

// TestAttackQueryLogDiskFullTearsALine: a batch that meets a full disk is
// written in part: write.go counts all its lines as dropped, yet the lines
// that fit are in the file, and the last one is cut in the middle with no
// newline; once the disk has room again, the next batch is appended to
// that stub, and the file holds a line that is not JSON. The README says a
// line is written or dropped and counted, and every line is one JSON object.
func TestAttackQueryLogDiskFullTearsALine(t *testing.T) {
	w := &fullDiskWriter{room: 1000} // several lines and a half
	l := newQueryLog(w, nil, 1, 1024, slog.New(slog.NewTextHandler(io.Discard, nil)))
	addLines(l, 20)
	settledAt(t, l, 20)
	w.free(1 << 20) // the operator makes room
	addLines(l, 20)
	settledAt(t, l, 40)
	closeQueryLog(t, l)

	text := w.text()
	written, dropped := l.stats()
	whole := strings.Count(text, "\n")
	t.Logf("%d written, %d dropped, %d newlines in the file", written, dropped, whole)
	if uint64(whole) != written {
		t.Errorf("the file holds %d lines, the counter says %d written (%d counted dropped)", whole, written, dropped)
	}
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if !strings.HasPrefix(line, `{"time":`) || strings.Count(line, `{"time":`) != 1 {
			t.Errorf("line %d is not one JSON object: %.200q", i, line)
		}
	}
	readLogLines(t, text)
}

// TestAttackStalledStderrStopsTheQueryLogFile: the query log writes to a
// healthy file, and its writer logs "query log reopened" (and a failed
// write's warning) to the process's log, synchronously, on stderr. When
// stderr stalls (a journald that lags, a pipe whose reader stopped), a
// SIGHUP leaves the writer blocked in that log line: it never drains its
// buffer again, and from then on every query's line is dropped, though the
// file has room. The stall of one stream stops the other. And reopen itself,
// called by the signal loop, logs its timeout's warning on the same stderr
// and never returns: SIGTERM is not heard.
func TestAttackStalledStderrStopsTheQueryLogFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "queries.log")
	f, err := openLogFile(path)
	if err != nil {
		t.Fatal(err)
	}
	stderr := newStuckWriter(t)
	l := newQueryLog(f, f, 1, 64, slog.New(slog.NewTextHandler(stderr, nil)))
	l.reopenWait = 100 * time.Millisecond // SIGHUP's own wait, not the point here
	t.Cleanup(func() {
		stderr.free()
		closeQueryLog(t, l)
	})
	reopened := make(chan struct{})
	go func() { l.reopen(); close(reopened) }() // logrotate's SIGHUP
	select {
	case <-reopened:
	case <-time.After(3 * time.Second):
		t.Errorf("SIGHUP's reopen (reopenWait 100 ms) has not returned in 3 s: it logs its warning on the stalled stderr, and the signal loop that called it never hears SIGTERM")
	}
	b, _ := query("www.example.com", dns.TypeA).Pack()
	for range 10 {
		l.add(time.Now(), time.Millisecond, netip.MustParseAddrPort("127.0.0.1:5353"), b[12:], metrics.Forwarded, dns.RcodeSuccess, "127.0.0.1:53")
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		if written, _ := l.stats(); written == 10 {
			return
		}
		if time.Now().After(deadline) {
			written, dropped := l.stats()
			t.Fatalf("3 s after a SIGHUP with stderr stalled, %d of 10 lines written to the file (%d dropped): the writer is held by its log line on stderr", written, dropped)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// addLines logs n lines of one forwarded query to l.
func addLines(l *queryLog, n int) {
	b, _ := query("www.example.com", dns.TypeA).Pack()
	for range n {
		l.add(time.Now(), time.Millisecond, netip.MustParseAddrPort("127.0.0.1:5353"), b[12:], metrics.Forwarded, dns.RcodeSuccess, "127.0.0.1:53")
	}
}

// settledAt waits until l has counted total lines, written or dropped.
func settledAt(t *testing.T, l *queryLog, total uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		written, dropped := l.stats()
		if written+dropped == total {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d written + %d dropped, want %d within 5s", written, dropped, total)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
