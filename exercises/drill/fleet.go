package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/redisproc"
)

// The fleet drill's contract: the chapter's provider refuses beyond
// 3,000/s; scaled down tenfold here so that three instances and their load
// fit a small machine. Each instance is offered the whole contract, three
// times its third.
const (
	fleetContract = 300 // DNS_UPSTREAM_RATE_LIMIT, per second: the fleet's total
	fleetBurst    = 30
	fleetN        = 3
)

// fleetRow is one run of the table.
type fleetRow struct {
	name      string
	mode      string // what the instances' mode gauge said during the run
	span      time.Duration
	upstream  int64 // queries the upstream received during the run
	refused   int64 // answers REFUSED (upstream_limited)
	sent      int64
	bound     float64 // the most the upstream may receive in the run; 0: none stated
	instances []*proxyProcess
}

func (f *fleetRow) perSecond() float64 { return float64(f.upstream) / f.span.Seconds() }

// drillFleet: three instances in front of one upstream whose contract is
// fleetContract: each with a local limit (the upstream sees three times the
// contract), then sharing it on Redis (it sees the contract), then Redis
// stopped (the local shares: about the contract). One table.
func drillFleet(r *rig) error {
	span := r.dur(5 * time.Second)
	redis, err := redisproc.Start()
	if err != nil {
		return err
	}
	defer redis.Kill()
	limit := fmt.Sprintf("%d,%d", fleetContract, fleetBurst)
	key := fmt.Sprintf("drill-%d", os.Getpid())
	r.printf("fleet: %d instances in front of one upstream whose contract is %d queries/s (the chapter's 3,000/s\n", fleetN, fleetContract)
	r.printf("  scaled down tenfold); each is offered %d/s, three times its third, for %s per run.\n\n", fleetContract, secs(span))

	// 1. Each instance its own limit: the operator set the contract, the
	// upstream gets it once per instance.
	local := &fleetRow{name: "each its own limit, no Redis", span: span, bound: 0}
	if err := r.startFleet(local, map[string]string{"DNS_UPSTREAM_RATE_LIMIT": limit}); err != nil {
		return err
	}
	r.fleetRun(local, nil)
	local.mode = "local"
	stopAll(local.instances)

	// 2. Shared on Redis: the contract is the fleet's.
	shared := &fleetRow{name: "shared on Redis", span: span}
	if err := r.startFleet(shared, map[string]string{"DNS_UPSTREAM_RATE_LIMIT": limit,
		"DNS_UPSTREAM_RATE_LIMIT_REDIS": redis.URL(), "DNS_UPSTREAM_RATE_LIMIT_KEY": key}); err != nil {
		return err
	}
	defer stopAll(shared.instances)
	for _, p := range shared.instances {
		if err := waitSample(p, "dnsproxi_upstream_ratelimit_fleet_instances", fleetN); err != nil {
			return err
		}
	}
	// rate × time + burst + the leases in hand when the run began (each at
	// most a block and a half, a block being a tenth of a second of the rate).
	block := min(fleetBurst, fleetContract/10)
	shared.bound = fleetContract*span.Seconds() + fleetBurst + float64(fleetN)*1.5*float64(block)
	calls := r.fleetCalls(shared.instances)
	r.fleetRun(shared, nil)
	shared.mode = r.fleetMode(shared.instances)
	callsPerSecond := float64(r.fleetCalls(shared.instances)-calls) / fleetN / span.Seconds()

	// 3. Redis stopped (SIGSTOP: connections accepted, nothing answered):
	// each instance's calls time out, and it spends its share, a third.
	stopped := &fleetRow{name: "Redis stopped (SIGSTOP)", span: span, instances: shared.instances}
	stopped.bound = 1.1 * fleetContract * span.Seconds()
	r.fleetRun(stopped, func() error {
		if err := redis.Stop(); err != nil {
			return err
		}
		for _, p := range stopped.instances {
			if err := waitSample(p, `dnsproxi_upstream_ratelimit_mode{mode="local"}`, 1); err != nil {
				return err
			}
		}
		return nil
	})
	stopped.mode = r.fleetMode(stopped.instances)
	if err := redis.Continue(); err != nil {
		return err
	}
	back := time.Now()
	for _, p := range stopped.instances {
		if err := waitSample(p, `dnsproxi_upstream_ratelimit_mode{mode="shared"}`, 1); err != nil {
			return err
		}
	}
	backIn := time.Since(back)

	rows := []*fleetRow{local, shared, stopped}
	r.printf("  %-30s %11s %11s %9s %9s %7s\n", "run", "upstream/s", "× contract", "bound/s", "REFUSED", "mode")
	for _, f := range rows {
		bound := "-"
		if f.bound > 0 {
			bound = fmt.Sprintf("%.0f", f.bound/f.span.Seconds())
		}
		r.printf("  %-30s %11.1f %11.2f %9s %9d %7s\n", f.name, f.perSecond(), f.perSecond()/fleetContract, bound, f.refused, f.mode)
	}
	r.printf("\n  (the upstream's count over each run of %s; bound: the most it may receive, shared: rate + (burst +\n", secs(span))
	r.printf("  the leases in hand, %d × 1.5 blocks of %d) ÷ the run; Redis stopped: 1.1 × the rate)\n", fleetN, block)
	r.printf("  Shared: %.1f Redis calls a second per instance. Redis continued: every instance back in shared\n", callsPerSecond)
	r.printf("  mode within %s.\n", secs(backIn))
	r.printf("\n  Notice: a limit set on each instance is a limit per instance: three of them sent the upstream\n")
	r.printf("  three times its contract. On Redis the contract is the fleet's, for at most 17 calls a second each:\n")
	r.printf("  an instance spends leased blocks locally. Redis stopped, each fell back to its third.\n")

	x := func(f *fleetRow) int { return int(100 * f.perSecond() / fleetContract) }
	r.numbers = map[string]int{"local_x100": x(local), "shared_x100": x(shared), "stopped_x100": x(stopped),
		"shared_upstream": int(shared.upstream), "shared_bound": int(shared.bound),
		"stopped_upstream": int(stopped.upstream), "stopped_bound": int(stopped.bound),
		"calls_per_second": int(callsPerSecond + 0.5)}
	r.expect(x(local) >= 240, "each its own limit: the upstream saw %.2f × the contract, want about 3", local.perSecond()/fleetContract)
	r.expect(float64(shared.upstream) <= shared.bound, "shared: the upstream received %d, over the bound %.0f", shared.upstream, shared.bound)
	r.expect(x(shared) >= 70, "shared: the upstream saw %.2f × the contract: the fleet refused more than its excess", shared.perSecond()/fleetContract)
	r.expect(shared.mode == "shared", "shared: the instances' mode was %s", shared.mode)
	r.expect(callsPerSecond <= 20, "shared: %.1f Redis calls a second per instance, want at most 20", callsPerSecond)
	r.expect(float64(stopped.upstream) <= stopped.bound, "Redis stopped: the upstream received %d, over 1.1 × the contract (%.0f)", stopped.upstream, stopped.bound)
	r.expect(x(stopped) >= 60, "Redis stopped: the upstream saw %.2f × the contract: the local shares refused too much", stopped.perSecond()/fleetContract)
	r.expect(stopped.mode == "local", "Redis stopped: the instances' mode was %s", stopped.mode)
	return nil
}

// startFleet starts fleetN instances with env in front of the rig's upstream.
func (r *rig) startFleet(f *fleetRow, env map[string]string) error {
	for range fleetN {
		e := map[string]string{"DNS_UPSTREAM": r.up.Addr()}
		for k, v := range env {
			e[k] = v
		}
		p, err := startProxy(r.bin, e)
		if err != nil {
			stopAll(f.instances)
			return err
		}
		f.instances = append(f.instances, p)
	}
	return nil
}

// fleetRun offers each instance the contract (three times its third) while
// before runs (nil: nothing), then counts what the upstream receives over
// f.span.
func (r *rig) fleetRun(f *fleetRow, before func() error) {
	stop := make(chan struct{})
	loads := make([]*pacedLoad, len(f.instances))
	for i, p := range f.instances {
		loads[i] = startPacedLoad(p.Addr, i, fleetContract, stop)
	}
	if before != nil {
		if err := before(); err != nil {
			r.expect(false, "%s: %v", f.name, err)
		}
	}
	from := r.up.Total()
	time.Sleep(f.span)
	f.upstream = r.up.Total() - from
	close(stop)
	for _, l := range loads {
		l.wait()
		f.refused += l.refused.Load()
		f.sent += l.sent.Load()
	}
}

// fleetMode is the mode all instances report, or "mixed".
func (r *rig) fleetMode(ps []*proxyProcess) string {
	mode := ""
	for _, p := range ps {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s, err := p.scrape(ctx)
		cancel()
		m := "?"
		switch {
		case err != nil:
		case s.Get(`dnsproxi_upstream_ratelimit_mode{mode="shared"}`) == 1:
			m = "shared"
		case s.Get(`dnsproxi_upstream_ratelimit_mode{mode="local"}`) == 1:
			m = "local"
		}
		if mode != "" && m != mode {
			return "mixed"
		}
		mode = m
	}
	return mode
}

// fleetCalls sums the Redis calls the instances made.
func (r *rig) fleetCalls(ps []*proxyProcess) int {
	total := 0.0
	for _, p := range ps {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s, err := p.scrape(ctx)
		cancel()
		if err != nil {
			r.expect(false, "reading /metrics: %v", err)
			continue
		}
		for _, result := range []string{"ok", "error", "timeout"} {
			total += s.Get(`dnsproxi_upstream_ratelimit_redis_calls_total{result="` + result + `"}`)
		}
	}
	return int(total)
}

// waitSample polls p's /metrics until the sample name reads want (10 s at most).
func waitSample(p *proxyProcess, name string, want float64) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s, err := p.scrape(ctx)
		cancel()
		if err == nil && s.Get(name) == want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not read %v within 10 s (%v):\n%s", name, want, err, p.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func stopAll(ps []*proxyProcess) {
	for _, p := range ps {
		p.Stop()
	}
}

// pacedLoad sends queries at a steady rate from one UDP socket, each for a
// name of its own, and counts the answers by rcode.
type pacedLoad struct {
	sent, answered, refused atomic.Int64
	done                    chan struct{}
}

// startPacedLoad sends rate queries a second to addr until stop is closed
// (a minute at most).
func startPacedLoad(addr string, id int, rate float64, stop <-chan struct{}) *pacedLoad {
	l := &pacedLoad{done: make(chan struct{})}
	c, err := net.Dial("udp", addr)
	if err != nil {
		close(l.done)
		return l
	}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		buf := make([]byte, 1500)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			l.answered.Add(1)
			if n >= 4 && buf[3]&0x0f == dns.RcodeRefused {
				l.refused.Add(1)
			}
		}
	}()
	go func() {
		defer close(l.done)
		start := time.Now()
		limit := time.After(time.Minute)
		for n := 0; ; {
			select {
			case <-stop:
			case <-limit:
			default:
				for due := int(time.Since(start).Seconds() * rate); n < due; n++ {
					m := new(dns.Msg)
					m.SetQuestion(fmt.Sprintf("f%d-%d.fleet.example.", n, id), dns.TypeA)
					m.Id = uint16(n)
					if b, err := m.Pack(); err == nil {
						if _, err := c.Write(b); err == nil {
							l.sent.Add(1)
						}
					}
				}
				time.Sleep(2 * time.Millisecond)
				continue
			}
			break
		}
		deadline := time.Now().Add(time.Second) // the answers still on their way
		for l.answered.Load() < l.sent.Load() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		c.Close()
		<-readerDone
	}()
	return l
}

func (l *pacedLoad) wait() { <-l.done }
