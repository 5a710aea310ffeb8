// Command drill runs the chapter's experiments live: a fake upstream that
// fails on command, the real dnsproxi binary in front of it configured only
// through its environment, clients on loopback, and a report read from the
// proxy's /metrics. It exits 1 when a gate did not behave as the chapter says.
//
//	go run ./exercises/drill ratelimit|breaker|flap|slow|slownames|failover|overload|fairness|degrade|fleet|all [-quick]
//	go run ./exercises/drill upstream -mode blackhole -addr 127.0.0.1:5300
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"dnsproxi/exercises/fakeupstream"
)

// drills in the order "all" runs them.
var drills = []struct {
	name, teaches string
	run           func(*rig) error
}{
	{"ratelimit", "a slow upstream and retrying clients fill the token bucket", drillRateLimit},
	{"breaker", "trip, open, probe, close: the breaker's whole cycle", drillBreaker},
	{"flap", "the breaker follows an upstream that dies and heals in turns", drillFlap},
	{"slow", "what clients see of a slow upstream, without and with the breaker", drillSlow},
	{"slownames", "slow names among answered neighbours cannot open the breaker; a dark upstream still does", drillSlowNames},
	{"failover", "two upstreams: a dead first is hedged around, tripped, probed back; a dead pair gets no retry storm", drillFailover},
	{"overload", "how the burst and the rate shape what passes", drillOverload},
	{"fairness", "one flooder and twenty polite clients: the global bucket, the per-client bucket, slip", drillFairness},
	{"degrade", "a dead upstream behind the cache: known names answered stale, with and without the cache", drillDegrade},
	{"fleet", "three instances, one upstream contract: a limit each, one shared on Redis, Redis stopped", drillFleet},
}

// harnesses run by name only, not by "all": they measure rather than teach.
var harnesses = []struct {
	name, teaches string
	run           func(*rig) error
}{
	{"blackhole-flood", "3000 QPS at a blackholed upstream: memory, goroutines, latency, in three configurations", drillBlackholeFlood},
	{"sources", "one query from each of 200,000 loopback sources: the per-client table's memory bound", drillSources},
	{"cache-flood", "unique names at 15,000 QPS for 30 s: the cache's byte bound beside RSS", drillCacheFlood},
}

func main() {
	os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
}

func cli(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	name, rest := args[0], args[1:]
	if name == "upstream" {
		return runUpstream(rest, stdout, stderr)
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", false, "scaled-down timings (what the tests run)")
	if err := fs.Parse(rest); err != nil {
		return 2
	}
	scale := 1.0
	if *quick {
		scale = quickScale
	}
	var todo []int
	for i, d := range drills {
		if name == "all" || name == d.name {
			todo = append(todo, i)
		}
	}
	for _, h := range harnesses {
		if name == h.name {
			drills = append(drills, h)
			todo = append(todo, len(drills)-1)
		}
	}
	if len(todo) == 0 {
		fmt.Fprintf(stderr, "drill: unknown drill %q\n", name)
		usage(stderr)
		return 2
	}
	failed := 0
	for _, i := range todo {
		r, err := runDrill(i, scale, stdout)
		if err != nil {
			fmt.Fprintf(stderr, "drill %s: %v\n", drills[i].name, err)
			failed++
			continue
		}
		if len(r.failures) > 0 {
			fmt.Fprintf(stdout, "\nFAIL %s: %s\n\n", drills[i].name, strings.Join(r.failures, "; "))
			failed++
		} else {
			fmt.Fprintf(stdout, "\nok   %s\n\n", drills[i].name)
		}
	}
	if failed > 0 {
		return 1
	}
	return 0
}

// quickScale is how much faster -quick runs every timing.
const quickScale = 0.2

// runDrill runs drill i with its own fake upstream and proxy, and stops both.
func runDrill(i int, scale float64, out io.Writer) (*rig, error) {
	dir, err := os.MkdirTemp("", "dnsproxi-drill")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin, err := buildProxy(dir)
	if err != nil {
		return nil, err
	}
	up, err := fakeupstream.Start("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer up.Close()
	r := &rig{out: out, bin: bin, scale: scale, up: up}
	defer r.stopProxy()
	fmt.Fprintf(out, "== %s: %s\n\n", drills[i].name, drills[i].teaches)
	start := time.Now()
	err = drills[i].run(r)
	fmt.Fprintf(out, "  (%s)\n", secs(time.Since(start)))
	return r, err
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: drill <name> [-quick]   runs a drill against the real dnsproxi\n")
	fmt.Fprintf(w, "       drill all [-quick]      runs them all\n")
	fmt.Fprintf(w, "       drill upstream -mode MODE -addr 127.0.0.1:5300 [-delay 1.5s] [-period 3s]\n\n")
	for _, d := range drills {
		fmt.Fprintf(w, "  %-16s %s\n", d.name, d.teaches)
	}
	for _, h := range harnesses {
		fmt.Fprintf(w, "  %-16s %s (not in all)\n", h.name, h.teaches)
	}
}

// runUpstream runs the fake upstream alone until interrupted.
func runUpstream(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("upstream", flag.ContinueOnError)
	fs.SetOutput(stderr)
	modeName := fs.String("mode", "ok", "ok, blackhole, slow, servfail, refused, truncate or flap")
	addr := fs.String("addr", "127.0.0.1:5300", "loopback host:port to listen on (UDP and TCP)")
	delay := fs.Duration("delay", 1500*time.Millisecond, "how long slow mode, and a name under slow. in any mode, waits before answering")
	period := fs.Duration("period", 3*time.Second, "how long each phase of flap lasts")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	mode, err := fakeupstream.ParseMode(*modeName)
	if err != nil {
		fmt.Fprintf(stderr, "drill upstream: -mode: %v\n", err)
		return 2
	}
	up, err := fakeupstream.Start(*addr)
	if err != nil {
		fmt.Fprintf(stderr, "drill upstream: %v\n", err)
		return 1
	}
	up.SetDelay(*delay)
	up.SetFlapPeriod(*period)
	up.SetMode(mode)
	fmt.Fprintf(stdout, "fake upstream on %s (udp+tcp), mode %s; Ctrl-C prints what it received\n", up.Addr(), mode)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	udp, tcp := up.Received()
	up.Close()
	fmt.Fprintf(stdout, "received %d UDP packets and %d TCP queries\n", udp, tcp)
	return 0
}
