package main

import (
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/metrics"
)

// TestAttackQueryLogTornTailCrossesARotation: a write that meets a full
// disk cuts a line and keeps its rest (l.torn) for the next write. The
// operator then does what a full disk calls for: logrotate moves the file
// away and sends SIGHUP. reopenFile swaps in the new file but keeps the
// torn rest, so the new file begins with the second half of a line from
// the old one: its first line is not JSON, and the old file ends in a
// half line that is never completed. The README says every line is one
// JSON object.
func TestAttackQueryLogTornTailCrossesARotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "queries.log")
	f, err := openLogFile(path)
	if err != nil {
		t.Fatal(err)
	}
	w := &fullDiskWriter{room: 1000} // several lines and a half, then ENOSPC
	l := newQueryLog(w, f, 1, 1024, slog.New(slog.NewTextHandler(io.Discard, nil)))
	b, _ := query("www.example.com", dns.TypeA).Pack()
	add := func(n int) {
		for range n {
			l.add(time.Now(), time.Millisecond, netip.MustParseAddrPort("127.0.0.1:5353"), b[12:], metrics.Forwarded, dns.RcodeSuccess, "127.0.0.1:53")
		}
	}
	settled := func(total uint64) {
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
	add(20)
	settled(20)
	if !strings.HasSuffix(w.text(), "}\n") {
		t.Logf("the full disk cut a line: the old file ends %q", w.text()[max(0, len(w.text())-40):])
	}
	// logrotate: move the file away, SIGHUP.
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	l.reopen()
	add(5)
	settled(25)
	closeQueryLog(t, l)

	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	for i, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if !strings.HasPrefix(line, `{"time":`) {
			t.Errorf("line %d of the new file after a rotation is not a JSON object: %.120q", i, line)
		}
	}
}
