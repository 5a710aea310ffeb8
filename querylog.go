package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"dnsproxi/internal/wire"
	"dnsproxi/metrics"
)

// The query log (DNS_QUERY_LOG) writes one JSON line per query: when it
// came, the client's address, the name and type asked, the outcome, the
// rcode answered (null when none was), the upstream that answered, and how
// long it took. It never blocks or slows the query path: a query's line goes
// into a bounded buffer with a non-blocking send, and one writer goroutine
// formats the lines and writes them in batches. When the buffer is full the
// line is dropped and counted (dnsproxi_query_log_dropped_total), as are the
// lines of a write that failed. SIGHUP reopens the file, for log rotation.

// Sizes of the query log's buffer and batches. The writer wakes every
// flushEvery and writes what has come, so a line takes at most that long to
// reach the file, and a sender never has to wake the writer. The buffer
// holds queryLogBuffer lines: 400,000 queries a second between two wake-ups
// before any line is dropped.
const (
	queryLogBuffer = 8192
	flushEvery     = 20 * time.Millisecond
	maxBatchLines  = 256             // lines formatted before a write
	reopenTimeout  = 5 * time.Second // SIGHUP waits no longer for a writer stuck on its disk
	// queryLogStopWait is how long shutdown waits for the writer to write
	// out what it holds (closeOutputs).
	queryLogStopWait = 2 * time.Second
)

// noAnswer is the rcode logged for a query that was dropped unanswered.
const noAnswer = -1

// QueryLogTarget is DNS_QUERY_LOG: "" (off, the zero value), "stderr", or an
// absolute file path, appended to.
type QueryLogTarget string

var errQueryLog = errors.New("must be off, stderr or an absolute file path such as /var/log/dnsproxi/queries.log")

// Decode parses off or stderr (any case), or an absolute path.
func (t *QueryLogTarget) Decode(s string) error {
	s = strings.TrimSpace(s)
	switch {
	case s == "" || strings.EqualFold(s, "off"):
		*t = ""
	case strings.EqualFold(s, "stderr"):
		*t = "stderr"
	case filepath.IsAbs(s):
		*t = QueryLogTarget(filepath.Clean(s))
	default:
		return errQueryLog
	}
	return nil
}

// String formats the target as DNS_QUERY_LOG takes it.
func (t QueryLogTarget) String() string {
	if t == "" {
		return "off"
	}
	return string(t)
}

// Sample is DNS_QUERY_LOG_SAMPLE: the share of queries logged, above 0 and
// at most 1. The zero value logs every query, as 1 does.
type Sample float64

var errSample = errors.New("must be a fraction above 0 and at most 1, such as 0.01 (one query in a hundred)")

// Decode parses a fraction above 0 and at most 1.
func (s *Sample) Decode(text string) error {
	f, err := strconv.ParseFloat(strings.TrimSpace(text), 64)
	if err != nil || !(f > 0 && f <= 1) { // NaN fails both
		return errSample
	}
	*s = Sample(f)
	return nil
}

// logEntry is one query's line before it is formatted: what the query path
// copies, and no more (formatting is the writer's work).
type logEntry struct {
	time     time.Time
	duration time.Duration
	client   netip.AddrPort
	upstream string
	outcome  metrics.Outcome
	rcode    int
	qlen     int
	q        [wire.MaxQuestionLen]byte // name, type and class as the client sent them
}

// queryLog is the bounded buffer and its writer goroutine.
type queryLog struct {
	entries    chan logEntry
	sample     sampler // which lines are kept (querylog_sample.go)
	written    atomic.Uint64
	dropped    atomic.Uint64
	reopens    chan chan struct{} // a SIGHUP's request, closed once done; room for one waiting
	reopenWait time.Duration      // how long a SIGHUP waits for its request to be done
	stop       chan struct{}
	done       chan struct{}
	once       sync.Once
	log        *slog.Logger // through events: the writer and SIGHUP's reopen never wait for stderr
	events     *asyncLog
	torn       []byte // the rest of a line a write cut short, written first next time (to the same file only)

	path string // the file's, reopened on SIGHUP; "" for stderr

	// The writer goroutine's own.
	out    io.Writer
	file   *os.File // out, when the target is a file
	buf    []byte
	failed bool // the last write failed: its error was logged once
}

// openQueryLog starts the query log that target names, writing to stderr
// for "stderr", or nil for off.
func openQueryLog(target QueryLogTarget, sample Sample, stderr io.Writer, log *slog.Logger) (*queryLog, error) {
	switch target {
	case "":
		return nil, nil
	case "stderr":
		return newQueryLog(stderr, nil, float64(sample), queryLogBuffer, log), nil
	}
	f, err := openLogFile(string(target))
	if err != nil {
		// The line names the path once, quoted: the error's own text
		// repeats it raw, and a newline in it would break the line.
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = fmt.Errorf("cannot open it: %w", pe.Err)
		}
		return nil, &configError{fmt.Errorf("DNS_QUERY_LOG=%q: %v", string(target), err)}
	}
	return newQueryLog(f, f, float64(sample), queryLogBuffer, log), nil
}

// configError is a configuration the process cannot start with, found
// only when it is put to use (a query log path that cannot be opened): run
// stops with exit code 2, as for an error in reading the configuration.
type configError struct{ err error }

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

func openLogFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
}

// newQueryLog starts a query log writing to out (file, if it is one, is
// reopened on SIGHUP) that keeps sample of the queries and buffers at most
// capacity lines.
func newQueryLog(out io.Writer, file *os.File, sample float64, capacity int, log *slog.Logger) *queryLog {
	l := &queryLog{
		entries:    make(chan logEntry, capacity),
		sample:     newSampler(sample),
		reopens:    make(chan chan struct{}, 1),
		reopenWait: reopenTimeout,
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
		out:        out,
		file:       file,
		buf:        make([]byte, 0, 64<<10),
	}
	if file != nil {
		l.path = file.Name()
	}
	// Its own lines go through a queue (asynclog.go): written on stderr
	// directly, a stalled stderr held the writer in "query log reopened",
	// so the file got no more lines, and SIGHUP's reopen in its timeout's
	// warning, so the signal loop never heard SIGTERM
	// (TestAttackStalledStderrStopsTheQueryLogFile).
	l.events, l.log = newAsyncLog(log)
	go l.run()
	return l
}

// add logs one query, unless the sample leaves it out. It never blocks:
// without room in the buffer the line is dropped and counted.
func (l *queryLog) add(start time.Time, d time.Duration, client netip.AddrPort, question []byte, o metrics.Outcome, rcode int, upstream string) {
	if !l.sample.keep(rand.Uint64) {
		return
	}
	e := logEntry{time: start, duration: d, client: client, upstream: upstream, outcome: o, rcode: rcode}
	e.qlen = copy(e.q[:], question)
	select {
	case l.entries <- e:
	default:
		l.dropped.Add(1)
	}
}

// stats returns the lines written and the lines dropped so far. Once the
// writer has stopped, the lines still in the buffer are never written:
// they count as dropped, with those added after close that found room
// there (a query answered as shutdown gave up waiting for it), so that
// every line offered is in exactly one count
// (TestLinesAfterCloseAreCountedDropped). Nothing takes from the buffer
// then, so the count only grows.
func (l *queryLog) stats() (written, dropped uint64) {
	select {
	case <-l.done: // read first: the writer's counts are final
		return l.written.Load(), l.dropped.Load() + uint64(len(l.entries))
	default:
		return l.written.Load(), l.dropped.Load()
	}
}

// reopen asks the writer to write out what it holds and reopen the file at
// the same path, as a log rotation needs, and waits (bounded) until it has.
// Lines added after it returns go to the new file. For stderr it does nothing.
// The request waits in a channel with room for one, so that a writer stuck
// in a write on its disk holds up neither the SIGHUP nor the signal loop
// that must still hear SIGTERM: it reopens when its write returns.
func (l *queryLog) reopen() {
	if l.path == "" {
		return
	}
	ack := make(chan struct{})
	select {
	case l.reopens <- ack:
	case <-l.done:
		return
	default:
		l.log.Warn("query log: a reopen asked for before still waits for the writer; it will reopen when its write returns", "path", l.path)
		return
	}
	t := time.NewTimer(l.reopenWait)
	defer t.Stop()
	select {
	case <-ack:
	case <-l.done:
	case <-t.C:
		l.log.Warn("query log: the writer did not reopen its file in time; it will when its write returns", "path", l.path)
	}
}

// close writes out every line buffered and stops the writer, waiting for it
// no longer than ctx allows: a writer stuck in a write on its disk does not
// hold up the process's shutdown, and the lines it still holds are lost.
// Lines added afterwards are never written, and count as dropped (stats).
func (l *queryLog) close(ctx context.Context) {
	l.once.Do(func() { close(l.stop) })
	select {
	case <-l.done:
	case <-ctx.Done():
		l.log.Warn("query log: the writer is stuck in a write; stopping without the lines it holds", "path", l.path)
	}
	l.events.Close()
}

// run is the writer goroutine.
func (l *queryLog) run() {
	defer close(l.done)
	tick := time.NewTicker(flushEvery)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			l.drain(cap(l.entries))
		case ack := <-l.reopens:
			l.drain(len(l.entries))
			l.reopenFile()
			close(ack)
		case <-l.stop:
			l.drain(len(l.entries))
			if l.file != nil {
				l.file.Close()
			}
			return
		}
	}
}

// drain writes up to n buffered lines, a batch at a time, and returns when
// the buffer is empty. Bounding it lets a stop or a reopen in under a flood.
func (l *queryLog) drain(n int) {
	for n > 0 {
		batch := 0
	fill:
		for batch < min(n, maxBatchLines) {
			select {
			case e := <-l.entries:
				l.buf = e.appendJSON(l.buf)
				batch++
			default:
				break fill
			}
		}
		if batch == 0 {
			return
		}
		n -= batch
		l.write(batch)
	}
}

// write writes the batch of lines in buf. A write cut short (a full disk
// takes what fits) counts the lines it wrote whole as written, and the one
// it cut too: its rest is kept, and written before anything else once the
// output takes bytes again, so the file never holds half a line joined to
// the next one. The lines after it are dropped and counted. (Before, the
// whole batch was counted dropped though part of it was in the file, and
// the next batch was appended to the cut line: a line that is not JSON,
// TestAttackQueryLogDiskFullTearsALine.)
func (l *queryLog) write(lines int) {
	defer func() { l.buf = l.buf[:0] }()
	if len(l.torn) > 0 {
		n, err := l.out.Write(l.torn)
		l.torn = l.torn[n:]
		if err != nil || len(l.torn) > 0 {
			l.failedWrite(lines, err)
			return
		}
	}
	n, err := l.out.Write(l.buf)
	if err != nil {
		whole := bytes.Count(l.buf[:n], []byte{'\n'})
		if n > 0 && n < len(l.buf) && l.buf[n-1] != '\n' {
			end := n + bytes.IndexByte(l.buf[n:], '\n') + 1 // every line ends in one
			l.torn = append(l.torn[:0], l.buf[n:end]...)
			whole++
		}
		l.written.Add(uint64(whole))
		l.failedWrite(lines-whole, err)
		return
	}
	l.failed = false
	l.written.Add(uint64(lines))
}

// failedWrite counts lines dropped by a write that failed with err, and
// says so once until a write succeeds.
func (l *queryLog) failedWrite(lines int, err error) {
	if err == nil {
		err = io.ErrShortWrite
	}
	l.dropped.Add(uint64(lines))
	if !l.failed {
		l.log.Warn("query log: write failed; its lines are counted as dropped", "path", l.path, "err", err)
	}
	l.failed = true
}

// reopenFile opens the path anew and swaps it in; if it cannot be opened,
// the old file stays in use.
func (l *queryLog) reopenFile() {
	f, err := openLogFile(l.path)
	if err != nil {
		l.log.Warn("query log: SIGHUP: cannot reopen; still writing to the file open before", "path", l.path, "err", err)
		return
	}
	if len(l.torn) > 0 {
		// The rest of a line a full disk cut belongs to the old file: one
		// last try there, then it is given up. In the new file it would
		// begin with half a line (TestAttackQueryLogTornTailCrossesARotation).
		l.out.Write(l.torn)
		l.torn = l.torn[:0]
	}
	l.file.Close()
	l.file, l.out = f, f
	l.log.Info("query log reopened", "path", l.path)
}
