package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
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

// logLine is one line of the query log as a reader parses it.
type logLine struct {
	Time       time.Time `json:"time"`
	Client     string    `json:"client"`
	Name       string    `json:"name"`
	Type       string    `json:"type"`
	Outcome    string    `json:"outcome"`
	Rcode      *string   `json:"rcode"` // null: no answer was sent
	Upstream   string    `json:"upstream"`
	DurationMs *float64  `json:"duration_ms"`
}

// readLogLines parses every line of text, failing the test on one that is
// not a whole JSON object with every field.
func readLogLines(t *testing.T, text string) []logLine {
	t.Helper()
	var lines []logLine
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		var l logLine
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("query log line %q: %v", sc.Text(), err)
		}
		var fields map[string]any
		json.Unmarshal(sc.Bytes(), &fields)
		for _, f := range []string{"time", "client", "name", "type", "outcome", "rcode", "upstream", "duration_ms"} {
			if _, ok := fields[f]; !ok {
				t.Fatalf("query log line %q lacks %s", sc.Text(), f)
			}
		}
		lines = append(lines, l)
	}
	return lines
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Every query is one JSON line: when it came, who asked, the name and type,
// how it ended, the rcode sent (null when none was), the upstream that
// answered, and how long it took.
func TestQueryLogOneLinePerQuery(t *testing.T) {
	up := startUpstream(t)
	path := filepath.Join(t.TempDir(), "queries.log")
	cfg := testConfig(up.Addr())
	cfg.QueryLog = QueryLogTarget(path)
	cfg.Allow = AccessRule{Prefixes: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}}
	cfg.RateLimit = RateLimit{Rate: minRate, Burst: 5} // five queries, then none: the clock stands still
	a := startProxy(t, cfg, guard.NewManualClock(time.Now()))

	noQuestion := new(dns.Msg)
	noQuestion.Id = dns.Id()
	status := query("status.example.com", dns.TypeA)
	status.Opcode = dns.OpcodeStatus
	upstream := up.Addr()
	tests := []struct {
		name           string
		src            string
		m              *dns.Msg
		qname, qtype   string
		outcome, rcode string // rcode "": no answer
		upstream       string
	}{
		{"forwarded", "127.0.0.1", query("www.Example.com", dns.TypeA), "www.Example.com.", "A", "forwarded", "NOERROR", upstream},
		{"escaped name", "127.0.0.1", query(`a\"b\\c\.d.example.com`, dns.TypeTXT), `a\"b\\c\.d.example.com.`, "TXT", "forwarded", "NOERROR", upstream},
		{"transfer", "127.0.0.1", query("example.com", dns.TypeAXFR), "example.com.", "AXFR", "transfer_refused", "REFUSED", ""},
		{"notimp", "127.0.0.1", status, "status.example.com.", "A", "notimp", "NOTIMP", ""},
		{"no question", "127.0.0.1", noQuestion, "", "", "formerr", "FORMERR", ""},
		{"denied", "127.0.0.2", query("www.example.com", dns.TypeAAAA), "www.example.com.", "AAAA", "denied", "REFUSED", ""},
		{"rate limited", "127.0.0.1", query("www.example.com", dns.TypeMX), "www.example.com.", "MX", "rate_limited", "", ""},
	}
	before := time.Now()
	for _, tt := range tests {
		if r := askFrom(t, "udp", tt.src, a.addr(), tt.m, 300*time.Millisecond); (tt.rcode == "") != (r == nil) {
			t.Fatalf("%s: reply %v, want one: %v", tt.name, r, tt.rcode != "")
		}
	}
	after := time.Now()
	stopProxy(t, a) // the log is written out when the proxy stops

	lines := readLogLines(t, readFile(t, path))
	if len(lines) != len(tests) {
		t.Fatalf("%d lines for %d queries:\n%s", len(lines), len(tests), readFile(t, path))
	}
	for i, tt := range tests {
		l := lines[i]
		rcode := ""
		if l.Rcode != nil {
			rcode = *l.Rcode
		}
		client, err := netip.ParseAddrPort(l.Client)
		if err != nil || client.Addr().String() != tt.src || client.Port() == 0 {
			t.Errorf("%s: client %q, want %s:port", tt.name, l.Client, tt.src)
		}
		if l.Name != tt.qname || l.Type != tt.qtype || l.Outcome != tt.outcome || rcode != tt.rcode || l.Upstream != tt.upstream {
			t.Errorf("%s: logged name %q type %q outcome %q rcode %q upstream %q\n want        %q      %q         %q       %q          %q",
				tt.name, l.Name, l.Type, l.Outcome, rcode, l.Upstream, tt.qname, tt.qtype, tt.outcome, tt.rcode, tt.upstream)
		}
		if l.Time.Before(before.Add(-time.Millisecond)) || l.Time.After(after) {
			t.Errorf("%s: time %v outside the test's %v..%v", tt.name, l.Time, before, after)
		}
		if l.DurationMs == nil || *l.DurationMs < 0 || *l.DurationMs > float64(after.Sub(before).Milliseconds()+1) {
			t.Errorf("%s: duration_ms %v", tt.name, l.DurationMs)
		}
	}
}

// stopProxy shuts a down now, as SIGTERM does.
func stopProxy(t *testing.T, a *app) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// SIGHUP reopens the file: after a rotation (rename, then SIGHUP) the lines
// of earlier queries are in the old file and those of later ones in a new
// file at the configured path.
func TestQueryLogReopenedOnSIGHUP(t *testing.T) {
	up := startUpstream(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "queries.log")
	cfg := testConfig(up.Addr())
	cfg.QueryLog = QueryLogTarget(path)
	a := startProxy(t, cfg, guard.RealClock{})

	ask(t, "udp", a.addr(), query("before.example.com", dns.TypeA))
	waitFor(t, "the first line", func() bool { b, _ := os.ReadFile(path); return len(b) > 0 })
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	a.reopen()
	ask(t, "udp", a.addr(), query("after.example.com", dns.TypeA))
	stopProxy(t, a)

	for file, want := range map[string]string{path + ".1": "before.example.com.", path: "after.example.com."} {
		lines := readLogLines(t, readFile(t, file))
		if len(lines) != 1 || lines[0].Name != want {
			t.Errorf("%s holds %+v, want one line for %s", filepath.Base(file), lines, want)
		}
	}
}

// blockedWriter blocks every Write until release is closed, as a stuck disk
// would; it counts the lines it was given.
type blockedWriter struct {
	release chan struct{}
	mu      sync.Mutex
	lines   int
}

func (w *blockedWriter) Write(p []byte) (int, error) {
	<-w.release
	w.mu.Lock()
	w.lines += bytes.Count(p, []byte("\n"))
	w.mu.Unlock()
	return len(p), nil
}

// A writer that does not keep up never slows the query path: add returns at
// once, a line with no room in the buffer is dropped and counted, and every
// line is either written or counted as dropped.
func TestQueryLogDropsWhenFull(t *testing.T) {
	w := &blockedWriter{release: make(chan struct{})}
	const capacity, added = 64, 1000
	l := newQueryLog(w, nil, 1, capacity, slog.New(slog.NewTextHandler(io.Discard, nil)))
	question := query("www.example.com", dns.TypeA)
	b, _ := question.Pack()
	qend := len(b)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range added {
			l.add(time.Now(), time.Millisecond, netip.MustParseAddrPort("127.0.0.1:5353"), b[12:qend], metrics.Forwarded, dns.RcodeSuccess, "127.0.0.1:53")
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("add blocked on a writer that does not write")
	}
	written, dropped := l.stats()
	if dropped < added-capacity-maxBatchLines || written != 0 {
		t.Fatalf("writer blocked: %d written, %d dropped of %d with room for %d", written, dropped, added, capacity)
	}
	close(w.release)
	closeQueryLog(t, l)
	written, dropped = l.stats()
	if written+dropped != added || int(written) != w.lines {
		t.Fatalf("%d written (%d reached the writer) + %d dropped, want %d in all", written, w.lines, dropped, added)
	}
}

// The sample keeps the share of queries it names: each query is drawn on
// its own, so 20,000 at 0.25 keep 5,000 give or take a few dozen.
func TestQueryLogSample(t *testing.T) {
	tests := []struct {
		sample   float64
		min, max int
	}{
		{1, 20000, 20000},
		{0.25, 4600, 5400}, // ±6σ
		{0.001, 1, 60},
	}
	for _, tt := range tests {
		t.Run(strings.TrimRight(strings.TrimRight(formatRate(tt.sample), "0"), "."), func(t *testing.T) {
			var out syncBuffer
			l := newQueryLog(&out, nil, tt.sample, 32768, slog.New(slog.NewTextHandler(io.Discard, nil)))
			b, _ := query("www.example.com", dns.TypeA).Pack()
			for range 20000 {
				l.add(time.Now(), time.Millisecond, netip.MustParseAddrPort("127.0.0.1:5353"), b[12:], metrics.Forwarded, dns.RcodeSuccess, "")
			}
			closeQueryLog(t, l)
			written, dropped := l.stats()
			lines := strings.Count(out.String(), "\n")
			if dropped != 0 || int(written) != lines || lines < tt.min || lines > tt.max {
				t.Errorf("sample %v: %d lines (%d written, %d dropped), want %d..%d", tt.sample, lines, written, dropped, tt.min, tt.max)
			}
		})
	}
}

// The log's variables: off by default; a bad value stops start-up with one
// line naming the variable, and exit code 2.
func TestQueryLogConfig(t *testing.T) {
	good := []struct {
		env    map[string]string
		target QueryLogTarget
		sample float64
	}{
		{map[string]string{}, "", 1},
		{map[string]string{"DNS_QUERY_LOG": "OFF"}, "", 1},
		{map[string]string{"DNS_QUERY_LOG": "stderr", "DNS_QUERY_LOG_SAMPLE": "0.01"}, "stderr", 0.01},
		{map[string]string{"DNS_QUERY_LOG": " /var/log/dnsproxi/queries.log "}, "/var/log/dnsproxi/queries.log", 1},
		{map[string]string{"DNS_QUERY_LOG_SAMPLE": "1"}, "", 1},
	}
	for _, tt := range good {
		t.Run(envString(tt.env), func(t *testing.T) {
			setEnv(t, withUpstream(tt.env))
			cfg, err := loadConfig()
			if err != nil {
				t.Fatal(err)
			}
			if cfg.QueryLog != tt.target || float64(cfg.QueryLogSample) != tt.sample {
				t.Errorf("DNS_QUERY_LOG %q sample %v, want %q %v", cfg.QueryLog, cfg.QueryLogSample, tt.target, tt.sample)
			}
		})
	}
	bad := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"DNS_QUERY_LOG": "queries.log"}, `DNS_QUERY_LOG="queries.log": must be off, stderr or an absolute file path such as /var/log/dnsproxi/queries.log`},
		{map[string]string{"DNS_QUERY_LOG_SAMPLE": "0"}, `DNS_QUERY_LOG_SAMPLE="0": must be a fraction above 0 and at most 1, such as 0.01 (one query in a hundred)`},
		{map[string]string{"DNS_QUERY_LOG_SAMPLE": "1.5"}, `DNS_QUERY_LOG_SAMPLE="1.5": must be a fraction above 0 and at most 1, such as 0.01 (one query in a hundred)`},
		{map[string]string{"DNS_QUERY_LOG_SAMPLE": "NaN"}, `DNS_QUERY_LOG_SAMPLE="NaN": must be a fraction above 0 and at most 1, such as 0.01 (one query in a hundred)`},
	}
	for _, tt := range bad {
		t.Run(envString(tt.env), func(t *testing.T) {
			exitsTwo(t, tt.env, tt.want)
		})
	}
}

// With the log on, /metrics counts its lines and its drops from zero.
func TestQueryLogMetrics(t *testing.T) {
	up := startUpstream(t)
	cfg := testConfig(up.Addr())
	cfg.MetricsAddr = "127.0.0.1:0"
	cfg.QueryLog = QueryLogTarget(filepath.Join(t.TempDir(), "queries.log"))
	a := startProxy(t, cfg, guard.RealClock{})
	ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA))
	waitFor(t, "the line to be written", func() bool {
		return strings.Contains(scrape(t, a), "\ndnsproxi_query_log_lines_total 1\n")
	})
	if page := scrape(t, a); !strings.Contains(page, "\ndnsproxi_query_log_dropped_total 0\n") {
		t.Errorf("/metrics lacks dnsproxi_query_log_dropped_total 0")
	}
}

// Names are written in presentation format inside a valid JSON string,
// whatever bytes their labels hold.
func TestQueryLogNameEscapes(t *testing.T) {
	tests := []struct {
		name string
		wire []byte
		want string // as the JSON string decodes
	}{
		{"root", []byte{0}, "."},
		{"plain", []byte("\x03www\x07example\x03com\x00"), "www.example.com."},
		{"dot in a label", []byte("\x03a.b\x03com\x00"), `a\.b.com.`},
		{"quote and backslash", []byte("\x04a\"\\b\x00"), `a\"\\b.`},
		{"space, control, high bytes", []byte("\x05a b\x01\xff\x00"), `a\032b\001\255.`},
		{"newline cannot start a line", []byte("\x03a\nb\x00"), `a\010b.`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := logEntry{client: netip.MustParseAddrPort("127.0.0.1:1"), rcode: dns.RcodeSuccess}
			e.qlen = copy(e.q[:], append(tt.wire, 0, 1, 0, 1)) // type A, class IN
			line := e.appendJSON(nil)
			if strings.Count(string(line), "\n") != 1 || line[len(line)-1] != '\n' {
				t.Fatalf("not one line: %q", line)
			}
			var got struct{ Name, Type string }
			if err := json.Unmarshal(line, &got); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			if got.Name != tt.want || got.Type != "A" {
				t.Errorf("name %q type %q, want %q A", got.Name, got.Type, tt.want)
			}
		})
	}
}

// BenchmarkQueryLogAdd is what a query pays with the log on: the sample,
// a copy of its question, a send into the buffer.
func BenchmarkQueryLogAdd(b *testing.B) {
	l := newQueryLog(io.Discard, nil, 1, queryLogBuffer, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer l.close(context.Background())
	m, _ := query("www.example.com", dns.TypeA).Pack()
	client := netip.MustParseAddrPort("127.0.0.1:5353")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.add(time.Now(), time.Millisecond, client, m[12:], metrics.Forwarded, dns.RcodeSuccess, "127.0.0.1:53")
		}
	})
	_, dropped := l.stats()
	b.ReportMetric(float64(dropped)/float64(b.N), "dropped/op")
}

// BenchmarkQueryLogLine is the writer's cost of one line.
func BenchmarkQueryLogLine(b *testing.B) {
	m, _ := query("www.example.com", dns.TypeA).Pack()
	e := logEntry{time: time.Now(), duration: 412 * time.Microsecond, client: netip.MustParseAddrPort("127.0.0.1:5353"),
		upstream: "127.0.0.1:53", rcode: dns.RcodeSuccess}
	e.qlen = copy(e.q[:], m[12:])
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = e.appendJSON(buf[:0])
	}
}

// closeQueryLog closes l, failing the test if its writer is not done within
// a few seconds.
func closeQueryLog(t *testing.T, l *queryLog) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l.close(ctx)
	select {
	case <-l.done:
	default:
		t.Fatal("the query log's writer did not stop within 5s")
	}
}
