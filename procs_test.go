package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"dnsproxi/dnsserver"
)

func TestWantOne(t *testing.T) {
	tests := []struct {
		one  bool
		busy float64
		want bool
	}{
		{true, 0, true},
		{true, 0.5, true},
		{true, procsUp, true},         // at the line: not yet
		{true, procsUp + 0.01, false}, // one P busier than that: every P
		{false, 3.5, false},
		{false, procsUp, false}, // between the lines: stays, whichever side it came from
		{false, procsDown, false},
		{false, procsDown - 0.01, true},
	}
	for _, tt := range tests {
		if got := wantOne(tt.one, tt.busy); got != tt.want {
			t.Errorf("wantOne(%v, %.2f) = %v, want %v", tt.one, tt.busy, got, tt.want)
		}
	}
}

// An operator's GOMAXPROCS is left as it is.
func TestAdaptProcsLeavesAnOperatorsChoice(t *testing.T) {
	t.Setenv("GOMAXPROCS", "2")
	before := runtime.GOMAXPROCS(0)
	if most := adaptProcs(t.Context(), func(one bool) { t.Errorf("focus(%v) while not adapting", one) }); most != 0 {
		t.Fatalf("adaptProcs = %d with GOMAXPROCS set, want 0 (not adapting)", most)
	}
	if got := runtime.GOMAXPROCS(0); got != before {
		t.Fatalf("GOMAXPROCS %d, was %d", got, before)
	}
}

// The proxy starts on one P, takes every P the default gives when one is
// busy, goes back to one when the load falls, and gives the default back
// when it stops; its UDP queries go to one socket exactly while it runs
// on one P. The process's CPU time is faked: busy is what the test
// says it is.
func TestAdaptProcsFollowsTheLoad(t *testing.T) {
	most := runtime.GOMAXPROCS(0)
	if most < 2 {
		t.Skipf("GOMAXPROCS is %d: nothing to adapt", most)
	}
	var rate, reads atomic.Int64 // CPU nanoseconds per wall second; the controller's readings
	fakeProcsCPU(t, &rate, &reads)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // a failed check must not leave the controller running
	focused := make(chan bool, 8)
	if got := adaptProcs(ctx, func(one bool) { focused <- one }); got != most {
		t.Fatalf("adaptProcs = %d, want %d", got, most)
	}
	wantProcs := func(what string, want int) {
		t.Helper()
		if !waitProcs(want, 5*time.Second) {
			t.Fatalf("%s: GOMAXPROCS %d, want %d", what, runtime.GOMAXPROCS(0), want)
		}
		select {
		case one := <-focused:
			if one != (want == 1) {
				t.Fatalf("%s: focus(%v) on %d Ps", what, one, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the UDP sockets were not told", what)
		}
	}
	wantProcs("at start", 1)
	rate.Store(9e8) // 0.9 of a core
	wantProcs("one P busy", most)
	rate.Store(7e8) // between the lines
	// Two whole periods at that rate: the controller reads the CPU time
	// once a period.
	for n, deadline := reads.Load()+3, time.Now().Add(5*time.Second); reads.Load() < n; {
		if time.Now().After(deadline) {
			t.Fatal("the controller stopped reading the CPU time")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := runtime.GOMAXPROCS(0); got != most {
		t.Fatalf("between the lines: GOMAXPROCS %d, want it to stay %d", got, most)
	}
	if len(focused) != 0 {
		t.Fatalf("between the lines: focus(%v), with the P count unchanged", <-focused)
	}
	rate.Store(1e8)
	wantProcs("load gone", 1)
	cancel()
	wantProcs("stopped", most)
}

// waitProcs polls the runtime's setting, which has no event to wait on,
// until it is want or the deadline passes; it reports whether it got there.
func waitProcs(want int, within time.Duration) bool {
	for deadline := time.Now().Add(within); runtime.GOMAXPROCS(0) != want; {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// fakeProcsCPU makes the controller's CPU time grow at *rate nanoseconds
// a second, and counts its readings.
func fakeProcsCPU(t *testing.T, rate, reads *atomic.Int64) {
	start, cpu0 := time.Now(), time.Duration(0)
	var last atomic.Int64
	procsCPU = func() time.Duration {
		reads.Add(1)
		now := time.Since(start)
		prev := time.Duration(last.Swap(int64(now)))
		cpu0 += time.Duration(float64(now-prev) * float64(rate.Load()) / 1e9)
		return cpu0
	}
	t.Cleanup(func() { procsCPU = processCPU })
}

// A kernel without reuse-port programs, or a port others held first, fails
// the same way each time the P count changes: the operator is told once,
// not every time the load crosses a line. A server shutting down is no
// failure at all.
func TestFocusLoggedWarnsOnce(t *testing.T) {
	tests := []struct {
		name  string
		err   error
		warns int
	}{
		{"no such option", fmt.Errorf("dnsserver: steering UDP queries: %w", syscall.ENOPROTOOPT), 1},
		{"port shared", dnsserver.ErrUDPPortShared, 1},
		{"server shut down", dnsserver.ErrServerClosed, 0},
		{"socket closed", fmt.Errorf("dnsserver: steering UDP queries: %w", net.ErrClosed), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			focus := focusLogged(slog.New(slog.NewTextHandler(&out, nil)), func(bool) error { return tt.err })
			for _, one := range []bool{true, false, true, false} {
				focus(one)
			}
			if got := strings.Count(out.String(), "could not steer"); got != tt.warns {
				t.Errorf("%d warnings over 4 changes, want %d:\n%s", got, tt.warns, out.String())
			}
		})
	}
}
