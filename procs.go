package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"dnsproxi/dnsserver"
)

// How many threads run the proxy's Go code at once (GOMAXPROCS), decided
// by the load:
//
//   - The proxy's work is mostly system calls made while holding a P (the
//     raw recvmmsg/sendmmsg of internal/batchio) and short hand-offs
//     between goroutines. A second P buys nothing until one is busy, and
//     costs: threads that spin looking for work, futex wake-ups when the
//     poller readies two goroutines at once, goroutines moving between
//     cores. On the 2-core test machine, beside NSD and the load
//     generator, against the default of one P a core: 474 against 1,164
//     µs on average at 40k q/s, a peak of 83k against 70k QPS, 194 against
//     214 µs at 15k (README, "CPU").
//   - But one P moves at most one core's worth of packets. So the proxy
//     opens every UDP socket it would with the default (one a core, at
//     start-up), then runs on one P, and takes every P the default gives
//     (the runtime's, as it is then) once one P is more than procsUp of a
//     core busy; it goes back to one when the whole process is below
//     procsDown of a core. The gap between the two keeps it from switching
//     back and forth: at procsDown, one P is busy well below procsUp.
//   - While it runs on one P, the kernel hands every UDP query to the
//     first of those sockets (focus, dnsserver.Server.FocusUDP): one
//     reader empties it in large batches, where queries spread over a
//     socket a core wake a reader each, one after another, on the one
//     thread. With every P, the kernel spreads them again, a reader each.
//   - Busy is the process's CPU time (user and system, every thread: the
//     system calls are the most of it) over each procsEvery of wall time.
//   - An operator who sets GOMAXPROCS has chosen: the proxy leaves it be.
//     So it does where the default is one P already.
const (
	procsUp    = 0.8
	procsDown  = 0.55
	procsEvery = 250 * time.Millisecond
)

// procsCPU reads the process's CPU time for adaptProcs; tests replace it.
var procsCPU = processCPU

// wantOne reports whether the next period runs on one P, given whether
// this one did and how busy it was (CPU seconds per second).
func wantOne(one bool, busy float64) bool {
	if one {
		return busy <= procsUp
	}
	return busy < procsDown
}

// adaptProcs runs the proxy on one P until it needs more, as the head
// comment says, until ctx ends, when it gives the runtime its default back.
// It calls focus(true) as it takes one P and focus(false) as it takes
// more, and once more as it stops.
// It returns the default it found, or 0 if it does not adapt: when
// GOMAXPROCS is set in the environment, or the default is one P. Taking
// more Ps it asks for the runtime's default as it is then
// (runtime.SetDefaultGOMAXPROCS), which also lets the runtime follow a
// changed CPU limit again; setting one P stops that until it does
// (TestProcsBusyPeriodTakesTheCurrentDefault).
func adaptProcs(ctx context.Context, focus func(one bool)) int {
	most := runtime.GOMAXPROCS(0)
	if _, set := os.LookupEnv("GOMAXPROCS"); set || most < 2 || !procsAdapt {
		return 0
	}
	runtime.GOMAXPROCS(1)
	focus(true)
	readCPU := procsCPU
	go func() {
		tick := time.NewTicker(procsEvery)
		defer tick.Stop()
		one, lastCPU, lastWall := true, readCPU(), time.Now()
		for {
			select {
			case <-ctx.Done():
				runtime.SetDefaultGOMAXPROCS()
				focus(false)
				return
			case now := <-tick.C:
				cpu := readCPU()
				busy := float64(cpu-lastCPU) / float64(now.Sub(lastWall))
				lastCPU, lastWall = cpu, now
				if next := wantOne(one, busy); next != one {
					one = next
					if one {
						runtime.GOMAXPROCS(1)
					} else {
						// The default as it is now, not as it was at start:
						// the CPUs the process may use can change while it
						// runs, and the runtime follows them again from here.
						runtime.SetDefaultGOMAXPROCS()
					}
					focus(one)
				}
			}
		}
	}()
	return most
}

// focusLogged returns adaptProcs's focus for the server's FocusUDP. It
// warns of the first failure only: a kernel without reuse-port programs,
// or a port others held first, fails the same way at every change of the
// P count, and the load may cross the lines all day. A server shutting
// down is no failure.
func focusLogged(log *slog.Logger, focusUDP func(one bool) error) func(one bool) {
	var warned atomic.Bool
	return func(one bool) {
		err := focusUDP(one)
		if err == nil || errors.Is(err, net.ErrClosed) || errors.Is(err, dnsserver.ErrServerClosed) {
			return
		}
		if !warned.Swap(true) {
			log.Warn("could not steer UDP queries; later failures are not logged", "to_first_socket", one, "err", err)
		}
	}
}
