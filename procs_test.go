package main

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

func TestNextProcs(t *testing.T) {
	tests := []struct {
		p, most int
		busy    float64
		want    int
	}{
		{1, 8, 0, 1},
		{1, 8, 0.5, 1},
		{1, 8, procsUp, 1},        // at the line: not yet
		{1, 8, procsUp + 0.01, 8}, // one P busier than that: every P
		{8, 8, 3.5, 8},
		{8, 8, procsUp, 8}, // between the lines: stays, whichever side it came from
		{8, 8, procsDown, 8},
		{8, 8, procsDown - 0.01, 1},
		{1, 2, 0.9, 2},
	}
	for _, tt := range tests {
		if got := nextProcs(tt.p, tt.most, tt.busy); got != tt.want {
			t.Errorf("nextProcs(%d, %d, %.2f) = %d, want %d", tt.p, tt.most, tt.busy, got, tt.want)
		}
	}
}

// An operator's GOMAXPROCS is left as it is.
func TestAdaptProcsLeavesAnOperatorsChoice(t *testing.T) {
	t.Setenv("GOMAXPROCS", "2")
	before := runtime.GOMAXPROCS(0)
	if most := adaptProcs(t.Context()); most != 0 {
		t.Fatalf("adaptProcs = %d with GOMAXPROCS set, want 0 (not adapting)", most)
	}
	if got := runtime.GOMAXPROCS(0); got != before {
		t.Fatalf("GOMAXPROCS %d, was %d", got, before)
	}
}

// The proxy starts on one P, takes every P the default gives when one is
// busy, goes back to one when the load falls, and gives the default back
// when it stops. The process's CPU time is faked: busy is what the test
// says it is.
func TestAdaptProcsFollowsTheLoad(t *testing.T) {
	most := runtime.GOMAXPROCS(0)
	if most < 2 {
		t.Skipf("GOMAXPROCS is %d: nothing to adapt", most)
	}
	var rate atomic.Int64 // CPU nanoseconds per wall second
	start, cpu0 := time.Now(), time.Duration(0)
	var last, reads atomic.Int64
	procsCPU = func() time.Duration {
		reads.Add(1)
		// CPU time grows at rate from the last reading on.
		now := time.Since(start)
		prev := time.Duration(last.Swap(int64(now)))
		cpu0 += time.Duration(float64(now-prev) * float64(rate.Load()) / 1e9)
		return cpu0
	}
	t.Cleanup(func() { procsCPU = processCPU })
	ctx, cancel := context.WithCancel(context.Background())
	if got := adaptProcs(ctx); got != most {
		cancel()
		t.Fatalf("adaptProcs = %d, want %d", got, most)
	}
	wantProcs := func(what string, want int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for runtime.GOMAXPROCS(0) != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: GOMAXPROCS %d, want %d", what, runtime.GOMAXPROCS(0), want)
			}
			time.Sleep(10 * time.Millisecond) // polling the runtime's setting, which has no event to wait on
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
	rate.Store(1e8)
	wantProcs("load gone", 1)
	cancel()
	wantProcs("stopped", most)
}
