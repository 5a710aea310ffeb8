package main

import (
	"context"
	"errors"
	"fmt"
	"image"
	"image/png"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The pieces of make compare that run without a bench: the reduction of a
// dnsperf run to its figures, the drawing of a sweep's table, and the
// checks that refuse a sweep's variables before anything starts.

// runScript runs a program of scripts/ (ten seconds at most) with only the
// given environment beside PATH and HOME, and returns its stdout, its
// stderr and its exit code.
func runScript(t *testing.T, env map[string]string, stdin string, name string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s did not finish in 10 s: %v\nstderr: %s", name, ctx.Err(), errOut.String())
	}
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("%s: %v", name, err)
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}

// answer is one query of a fake dnsperf -v run: its response code ("T" for
// a timeout) and its latency in microseconds.
type answer struct {
	rcode string
	us    int
}

// dnsperfOutput writes what dnsperf 2.10 prints for a run with -v whose
// queries got the answers given (in a shuffled order, as they arrive), and
// whose summary says the rest.
func dnsperfOutput(answers []answer, sent, lost int, codes string, qps, avg string) string {
	var b strings.Builder
	b.WriteString("DNS Performance Testing Tool\nVersion 2.10.0\n\n[Status] Command line: dnsperf -s 127.0.0.1 -p 19398 -Q 1000 -v\n")
	b.WriteString("[Status] Sending queries (to 127.0.0.1:19398)\n[Status] Started at: Mon Nov 30 03:45:11 2026\n[Status] Stopping after 2.000000 seconds\n")
	r := rand.New(rand.NewPCG(1, 2))
	for i, j := range r.Perm(len(answers)) {
		a := answers[j]
		if a.rcode == "T" {
			fmt.Fprintf(&b, "> T r%d-1234.example.com A\n", i)
			continue
		}
		fmt.Fprintf(&b, "> %s r%d-1234.example.com A %d.%06d\n", a.rcode, i, a.us/1000000, a.us%1000000)
	}
	b.WriteString("[Status] Testing complete (time limit)\n\nStatistics:\n\n")
	fmt.Fprintf(&b, "  Queries sent:         %d\n  Queries completed:    %d\n  Queries lost:         %d (%.2f%%)\n\n", sent, sent-lost, lost, 100*float64(lost)/float64(sent))
	fmt.Fprintf(&b, "  Response codes:       %s\n  Average packet size:  request 44, response 94\n  Run time (s):         2.000260\n", codes)
	fmt.Fprintf(&b, "  Queries per second:   %s\n\n  Average Latency (s):  %s (min 0.000035, max 0.005243)\n  Latency StdDev (s):   0.000302\n\n", qps, avg)
	return b.String()
}

// repeat returns n answers of one code and latency.
func repeat(n int, rcode string, us int) []answer {
	a := make([]answer, n)
	for i := range a {
		a[i] = answer{rcode, us}
	}
	return a
}

// dnsperfstats.awk reduces a run to "qps avg_us p50_us p99_us noerror%
// lost% other": the percentiles nearest-rank over the -v lines, exact below
// 1 ms and to three significant digits above, timeouts left out of them.
func TestDnsperfStats(t *testing.T) {
	awk := tool(t, "awk", "mawk")
	oneToHundred := make([]answer, 100)
	for i := range oneToHundred {
		oneToHundred[i] = answer{"NOERROR", i + 1}
	}
	tests := []struct {
		name string
		out  string
		want string
	}{
		{"summary only, as in QPS mode",
			dnsperfOutput(nil, 2000, 0, "NOERROR 2000 (100.00%)", "999.870017", "0.000103"),
			"1000 103 - - 100.0 0.00"},
		{"1 to 100 µs",
			dnsperfOutput(oneToHundred, 100, 0, "NOERROR 100 (100.00%)", "50.000000", "0.000051"),
			"50 51 50 99 100.0 0.00"},
		{"three significant digits above 1 ms",
			dnsperfOutput(append(repeat(98, "NOERROR", 100), repeat(2, "NOERROR", 123456)...), 100, 0, "NOERROR 100 (100.00%)", "50.000000", "0.002567"),
			"50 2567 100 123000 100.0 0.00"},
		{"the rank is rounded up",
			dnsperfOutput([]answer{{"NOERROR", 300}, {"NOERROR", 100}, {"NOERROR", 200}}, 3, 0, "NOERROR 3 (100.00%)", "1.500000", "0.000200"),
			"2 200 200 300 100.0 0.00"},
		{"one answer is every percentile",
			dnsperfOutput(repeat(1, "NOERROR", 4321), 1, 0, "NOERROR 1 (100.00%)", "1.000000", "0.004321"),
			"1 4321 4320 4320 100.0 0.00"},
		{"timeouts are lost, not latencies; the commonest other code is named",
			dnsperfOutput(append(append(repeat(8, "NOERROR", 200), repeat(2, "SERVFAIL", 5000)...), repeat(2, "T", 0)...),
				12, 2, "NOERROR 8 (80.00%), SERVFAIL 2 (20.00%)", "5.000000", "0.001160"),
			"5 1160 200 5000 80.0 16.67 SERVFAIL"},
		{"nothing sent", "DNS Performance Testing Tool\nVersion 2.10.0\n\nError: socket: address already in use\n", "fail"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, code := runScript(t, nil, tt.out, awk, "-f", "scripts/dnsperfstats.awk")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			if got := strings.Join(strings.Fields(stdout), " "); got != tt.want {
				t.Errorf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}

// sweepTable is a sweep's table as compare.sh writes it: comments, the
// header, rows rate by rate, one figure missing.
const sweepTable = `# udp, dnsperf 8 clients, at most 100 outstanding, offered 1000 15000 then ×1.5 q/s
# 2 cores, load average 0.10 0.20 0.30; PROXY_ENV=''
forwarder	offered	achieved	avg_us	p50_us	p99_us	lost%	noerror%
dnsproxi	1000	1000	173	150	600	0.00	100.0
dnsdist	1000	1000	126	110	400	0.00	100.0
direct	1000	1000	67	60	200	0.00	100.0
dnsproxi	15000	14990	110	100	450	0.00	100.0
dnsdist	15000	15000	67	60	-	0.00	100.0
direct	15000	15000	34	30	120	0.00	100.0
dnsproxi	22500	17000	2900	2500	9000	0.50	100.0
dnsdist	22500	22480	99	90	400	0.00	100.0
direct	22500	22500	36	30	130	0.00	100.0
`

// sweepplot.sh draws a sweep's table: a PNG of the size it sets, with a line
// in each forwarder's colour, and the gnuplot program beside it holding
// every forwarder's rows; a file that is not a table is refused with one line.
func TestSweepPlot(t *testing.T) {
	tool(t, "gnuplot", "gnuplot-nox")
	dir := t.TempDir()
	table := filepath.Join(dir, "sweep.tsv")
	writeFile(t, table, sweepTable)
	out := filepath.Join(dir, "sweep.png")
	_, stderr, code := runScript(t, nil, "", "bash", "scripts/sweepplot.sh", table, out, "a title\n2 cores, 2026-11-30")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s is not a PNG: %v", out, err)
	}
	if b := img.Bounds(); b.Dx() != 1100 || b.Dy() != 1150 {
		t.Errorf("the PNG is %dx%d, want 1100x1150", b.Dx(), b.Dy())
	}
	colours := map[string][3]uint32{"dnsproxi": {0xd6, 0x27, 0x28}, "dnsdist": {0x1f, 0x77, 0xb4}, "direct": {0x40, 0x40, 0x40}}
	for name, c := range colours {
		if n := pixelsOf(img, c); n < 200 {
			t.Errorf("%d pixels in %s's colour #%02x%02x%02x, want its lines (hundreds)", n, name, c[0], c[1], c[2])
		}
	}
	gp, err := os.ReadFile(filepath.Join(dir, "sweep.gp"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"$d1 << EOD\ndnsproxi\t1000\t", "$d2 << EOD\ndnsdist\t1000\t", "$d3 << EOD\ndirect\t1000\t",
		"dnsproxi\t22500\t17000\t2900", `fwds = "dnsproxi dnsdist direct `, `a title\n2 cores, 2026-11-30`} {
		if !strings.Contains(string(gp), want) {
			t.Errorf("the gnuplot program lacks %q:\n%s", want, gp)
		}
	}

	for _, bad := range []struct{ name, text string }{
		{"no rows", "# nothing measured\nforwarder\toffered\tachieved\tavg_us\tp50_us\tp99_us\tlost%\tnoerror%\n"},
		{"not a row", "forwarder\toffered\nsomething else\n"},
		{"a load that is not a number", "dnsproxi\tmany\t1\t2\t3\t4\t0.00\t100.0\n"},
	} {
		t.Run(bad.name, func(t *testing.T) {
			table := filepath.Join(t.TempDir(), "bad.tsv")
			writeFile(t, table, bad.text)
			_, stderr, code := runScript(t, nil, "", "bash", "scripts/sweepplot.sh", table, filepath.Join(t.TempDir(), "bad.png"))
			if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, "sweepplot: ") {
				t.Errorf("exit %d, stderr %q: want exit 2 and one line", code, stderr)
			}
		})
	}
}

// pixelsOf counts the pixels of img of exactly the colour c (8-bit RGB).
func pixelsOf(img image.Image, c [3]uint32) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if r>>8 == c[0] && g>>8 == c[1] && bl>>8 == c[2] {
				n++
			}
		}
	}
	return n
}

// compare.sh checks a sweep's variables before it builds or starts anything:
// a wrong one stops it with exit 2 and one line naming it. PROTO is wrong in
// every case, so a sweep accepted by mistake stops there too, naming PROTO,
// instead of starting a bench; the first case shows a good sweep gets there.
func TestCompareSweepVariables(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	writeFile(t, notDir, "")
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"a good sweep passes", map[string]string{"SWEEP": "1000 5000 +", "SWEEP_STEPS": "4", "SWEEP_MINUTES": "5"}, `compare: PROTO="bogus": want udp or tcp`},
		{"the default sweep passes", map[string]string{"SWEEP": "1"}, `compare: PROTO="bogus": want udp or tcp`},
		{"falling loads", map[string]string{"SWEEP": "5000 1000"}, `compare: SWEEP="5000 1000": want 1, or rising loads`},
		{"+ not last", map[string]string{"SWEEP": "1000 + 2000"}, `compare: SWEEP="1000 + 2000": want 1, or rising loads`},
		{"+ alone", map[string]string{"SWEEP": "+"}, `compare: SWEEP="+": want 1, or rising loads`},
		{"not a number", map[string]string{"SWEEP": "fast"}, `compare: SWEEP="fast": want 1, or rising loads`},
		{"a leading zero", map[string]string{"SWEEP": "0100"}, `compare: SWEEP="0100": want 1, or rising loads`},
		{"with RATE", map[string]string{"SWEEP": "1", "RATE": "1000"}, `compare: SWEEP="1" and RATE="1000": set one of them`},
		{"no steps", map[string]string{"SWEEP": "1", "SWEEP_STEPS": "0"}, `compare: SWEEP_STEPS="0": want an integer of at least 1`},
		{"no minutes", map[string]string{"SWEEP": "1", "SWEEP_MINUTES": "x"}, `compare: SWEEP_MINUTES="x": want an integer of at least 1`},
		{"OUT a file", map[string]string{"SWEEP": "1", "OUT": notDir}, `compare: OUT="` + notDir + `": cannot write a directory there`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.env["PROTO"] = "bogus"
			_, stderr, code := runScript(t, tt.env, "", "bash", "scripts/compare.sh")
			if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, tt.want) {
				t.Errorf("exit %d, stderr %q\nwant exit 2 and one line starting %q", code, stderr, tt.want)
			}
		})
	}
}

// make fuzz passes a run that Go's fuzzing coordinator ended with a bare
// "context deadline exceeded" and no failing input (golang/go#75804), and
// fails one that wrote a failing input or failed otherwise. A fake go
// command plays each ending.
func TestFuzzScriptTellsTheCoordinatorsDeadlineFromAFinding(t *testing.T) {
	deadline := "fuzz: elapsed: 10s, execs: 1000 (100/sec)\n--- FAIL: FuzzX (10.40s)\n    context deadline exceeded\nFAIL\nexit status 1\nFAIL\tdnsproxi\t10.405s\n"
	minimizing := "fuzz: minimizing 45-byte failing input file\nfuzz: elapsed: 10s, minimizing\n"
	unwritten := "--- FAIL: FuzzX (10.40s)\n    context deadline exceeded\n    open testdata/fuzz/FuzzX/238fc6818d7b5878: permission denied\nFAIL\nexit status 1\n"
	finding := "--- FAIL: FuzzX (0.10s)\n    fuzz_test.go:9: boom\n    Failing input written to testdata/fuzz/FuzzX/0123\nFAIL\n"
	tests := []struct {
		name   string
		output string
		writes bool // the fake writes a failing input into the corpus
		code   int  // its exit code
		want   int
	}{
		{"passed", "PASS\nok\tdnsproxi\t10.1s\n", false, 0, 0},
		{"the coordinator's deadline, nothing written", deadline, false, 1, 0},
		{"the deadline's words, but an input written", deadline, true, 1, 1},
		{"a finding", finding, true, 1, 1},
		{"another failure", "--- FAIL: FuzzX (0.10s)\n    seed#0: boom\nFAIL\n", false, 1, 1},
		// The deadline can strike while a failing input is being minimized:
		// the coordinator then writes it and still reports the bare deadline
		// (internal/fuzz's deferred writeToCorpus), so the directory's listing
		// stays the same when the file was there before, under the same name,
		// and a write that failed only adds its error below the deadline's line.
		{"the deadline while minimizing, the input already there", minimizing + deadline, false, 1, 1},
		{"the deadline while minimizing, the input not written", minimizing + unwritten, false, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pkg := t.TempDir()
			fake := filepath.Join(t.TempDir(), "go")
			script := "#!/bin/sh\ncat <<'OUT'\n" + tt.output + "OUT\n"
			if tt.writes {
				script += "mkdir -p " + filepath.Join(pkg, "testdata/fuzz/FuzzX") + " && touch " + filepath.Join(pkg, "testdata/fuzz/FuzzX/0123") + "\n"
			}
			script += fmt.Sprintf("exit %d\n", tt.code)
			if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			_, stderr, code := runScript(t, map[string]string{"GO": fake}, "", "bash", "scripts/fuzz.sh", pkg, "FuzzX", "10s")
			if code != tt.want {
				t.Errorf("exit %d, want %d; stderr: %s", code, tt.want, stderr)
			}
		})
	}
}
