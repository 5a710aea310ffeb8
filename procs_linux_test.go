package main

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// cpuMask is a sched_setaffinity mask wide enough for this machine.
type cpuMask [16]uint64

func getAffinity(t *testing.T) cpuMask {
	t.Helper()
	var m cpuMask
	if _, _, e := syscall.RawSyscall(syscall.SYS_SCHED_GETAFFINITY, 0, unsafe.Sizeof(m), uintptr(unsafe.Pointer(&m))); e != 0 {
		t.Skipf("sched_getaffinity: %v", e)
	}
	return m
}

// setAffinityAll gives every thread of the process the mask m, as
// taskset -a -p does: the runtime reads the CPUs it may use from whichever
// thread sysmon runs on.
func setAffinityAll(t *testing.T, m cpuMask) {
	t.Helper()
	// Threads started while this runs inherit either mask: a few rounds
	// catch them.
	for range 3 {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Skipf("threads: %v", err)
		}
		for _, task := range tasks {
			tid, err := strconv.Atoi(task.Name())
			if err != nil {
				continue
			}
			syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, uintptr(tid), unsafe.Sizeof(m), uintptr(unsafe.Pointer(&m)))
		}
	}
}

// Since Go 1.25 the runtime's default P count follows the CPUs the process
// may use while it runs (cgroup CPU limit, CPU affinity): README's CPU
// paragraph counts on it. When those shrink under a running proxy (systemctl
// set-property CPUQuota=, a container resized, taskset), a busy period must
// not take the proxy above what it may now use.
func TestProcsBusyPeriodTakesTheCurrentDefault(t *testing.T) {
	// The test runner sets GOMAXPROCS itself, which stops the runtime's
	// updates: give them back, as in a process the runner did not start.
	runtime.SetDefaultGOMAXPROCS()
	t.Cleanup(runtime.SetDefaultGOMAXPROCS) // runs last: after the mask is back
	most := runtime.GOMAXPROCS(0)
	if most < 2 {
		t.Skipf("GOMAXPROCS is %d: nothing to adapt", most)
	}
	all := getAffinity(t)
	t.Cleanup(func() { setAffinityAll(t, all) })
	one := cpuMask{}
	for i, w := range all { // the lowest CPU the process may use
		if w != 0 {
			one[i] = w & -w
			break
		}
	}
	// The runtime follows a narrower mask on its own (control).
	setAffinityAll(t, one)
	if !waitProcs(1, 5*time.Second) {
		t.Skipf("the runtime did not follow the CPU mask here (GOMAXPROCS %d)", runtime.GOMAXPROCS(0))
	}
	setAffinityAll(t, all)
	if !waitProcs(most, 5*time.Second) {
		t.Fatalf("the runtime did not follow the CPU mask back (GOMAXPROCS %d, want %d)", runtime.GOMAXPROCS(0), most)
	}

	var rate, reads atomic.Int64
	fakeProcsCPU(t, &rate, &reads)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cancel()
			waitProcs(most, 5*time.Second)
		}
	})
	if got := adaptProcs(ctx, func(bool) {}); got != most {
		t.Fatalf("adaptProcs = %d, want %d", got, most)
	}
	if !waitProcs(1, 5*time.Second) {
		t.Fatalf("at start: GOMAXPROCS %d, want 1", runtime.GOMAXPROCS(0))
	}
	// The proxy may now use one CPU; then it gets busy.
	setAffinityAll(t, one)
	rate.Store(9e8)
	for n, deadline := reads.Load()+4, time.Now().Add(5*time.Second); reads.Load() < n; {
		if time.Now().After(deadline) {
			t.Fatal("the controller stopped reading the CPU time")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := runtime.GOMAXPROCS(0); got > 1 {
		t.Errorf("busy on a process that may use 1 CPU: GOMAXPROCS %d, the start-up default, want at most 1 (the runtime's default now)", got)
	}

	// Stopped, the proxy gives the P count back to the runtime, which
	// follows the CPUs again: back to all of them, then to one.
	setAffinityAll(t, all)
	cancel()
	stopped = true
	if !waitProcs(most, 5*time.Second) {
		t.Fatalf("stopped: GOMAXPROCS %d, want %d", runtime.GOMAXPROCS(0), most)
	}
	setAffinityAll(t, one)
	if !waitProcs(1, 5*time.Second) {
		t.Errorf("stopped, on a process that may use 1 CPU: GOMAXPROCS stays %d: runtime.GOMAXPROCS turned the runtime's updates off for good", runtime.GOMAXPROCS(0))
	}
}
