package main

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	addLines(l, 20)
	settledAt(t, l, 20)
	if !strings.HasSuffix(w.text(), "}\n") {
		t.Logf("the full disk cut a line: the old file ends %q", w.text()[max(0, len(w.text())-40):])
	}
	// logrotate: move the file away, SIGHUP.
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	l.reopen()
	addLines(l, 5)
	settledAt(t, l, 25)
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
