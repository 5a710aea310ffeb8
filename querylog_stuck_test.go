package main

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
	"dnsproxi/metrics"
)

// stuckWriter blocks every Write until release is closed, as a file on a
// stuck disk would, and reports on entered when a Write has begun.
type stuckWriter struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

// free lets every Write through, now and from then on.
func (w *stuckWriter) free() { w.once.Do(func() { close(w.release) }) }

func newStuckWriter(t *testing.T) *stuckWriter {
	w := &stuckWriter{entered: make(chan struct{}, 1), release: make(chan struct{})}
	t.Cleanup(w.free)
	return w
}

func (w *stuckWriter) Write(p []byte) (int, error) {
	select {
	case w.entered <- struct{}{}:
	default:
	}
	<-w.release
	return len(p), nil
}

// stuckQueryLog returns a query log on a file path whose writer is stuck in
// a Write, holding one line.
func stuckQueryLog(t *testing.T) (*queryLog, *stuckWriter) {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "queries.log"))
	if err != nil {
		t.Fatal(err)
	}
	w := newStuckWriter(t)
	l := newQueryLog(w, f, 1, 64, slog.New(slog.NewTextHandler(io.Discard, nil)))
	b, _ := query("www.example.com", dns.TypeA).Pack()
	l.add(time.Now(), time.Millisecond, netip.MustParseAddrPort("127.0.0.1:5353"), b[12:], metrics.Forwarded, dns.RcodeSuccess, "127.0.0.1:53")
	select {
	case <-w.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the query log's writer never wrote")
	}
	return l, w
}

// SIGHUP with the query log's writer stuck on its disk returns within its
// bound (the signal loop that called it must go on to hear SIGTERM), and
// the reopen it asked for is done once the write returns: the next line
// goes to the file at the path. Before, the request waited, with no bound,
// for the writer to take it.
func TestQueryLogReopenBoundedWhileWriterStuck(t *testing.T) {
	l, w := stuckQueryLog(t)
	l.reopenWait = 50 * time.Millisecond
	returned := make(chan struct{})
	go func() { l.reopen(); close(returned) }()
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("reopen still blocked 5s after SIGHUP while the writer is stuck in a write (its bound: 50ms)")
	}
	w.free()
	// A line added before the writer takes the reopen goes to the old
	// writer: add one each try until one reaches the file.
	b, _ := query("after.example.com", dns.TypeA).Pack()
	waitFor(t, "the reopened file to take a line", func() bool {
		l.add(time.Now(), time.Millisecond, netip.MustParseAddrPort("127.0.0.1:5353"), b[12:], metrics.Forwarded, dns.RcodeSuccess, "")
		time.Sleep(flushEvery)
		data, _ := os.ReadFile(l.path)
		return strings.Contains(string(data), "after.example.com")
	})
	closeQueryLog(t, l)
}

// Shutdown keeps to its context even when the query log's writer is stuck
// on its disk: the process must stop.
func TestShutdownBoundedWhileQueryLogStuck(t *testing.T) {
	up := startUpstream(t)
	a, err := newApp(testConfig(up.Addr()), guard.RealClock{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	l, _ := stuckQueryLog(t)
	a.proxy.qlog = l
	if err := a.start(); err != nil {
		t.Fatal(err)
	}
	ask(t, "tcp", a.addr(), query("www.example.com", dns.TypeA))

	const grace = 300 * time.Millisecond
	returned := make(chan struct{})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		a.shutdown(ctx)
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(grace + 3*time.Second):
		t.Fatalf("shutdown with a %v context still running after %v: it waits on the query log's stuck writer", grace, grace+3*time.Second)
	}
}

// A shutdown whose drain used up its deadline (a TCP client that stops
// reading holds it for the 2 s write timeout, past DNS_UPSTREAM_TIMEOUT +
// 1 s at a short upstream timeout) still lets a healthy query log write out
// what it holds: closeOutputs gives the writer time of its own. (From a
// no-context review: with the log's close on the drain's context, it
// returned at once and the process exited with the lines unwritten, 0 of
// 50 in the file.) Lines are lost only to a writer stuck on its disk
// (TestShutdownBoundedWhileQueryLogStuck).
func TestQueryLogWrittenOutWhenTheDrainUsedTheDeadline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "queries.log")
	f, err := openLogFile(path)
	if err != nil {
		t.Fatal(err)
	}
	l := newQueryLog(f, f, 1, 64, slog.New(slog.NewTextHandler(io.Discard, nil)))
	up := startUpstream(t)
	a, err := newApp(testConfig(up.Addr()), guard.RealClock{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	a.proxy.qlog = l
	if err := a.start(); err != nil {
		t.Fatal(err)
	}
	const lines = 50
	b, _ := query("www.example.com", dns.TypeA).Pack()
	for range lines {
		l.add(time.Now(), time.Millisecond, netip.MustParseAddrPort("127.0.0.1:5353"), b[12:], metrics.Forwarded, dns.RcodeSuccess, "127.0.0.1:53")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the server's drain used the deadline up
	a.shutdown(ctx)
	// shutdown has returned: run returns and the process exits now.
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(data), "\n"); got != lines {
		t.Fatalf("close returned with %d of %d lines in the file, its writer healthy: the rest die with the process", got, lines)
	}
}
