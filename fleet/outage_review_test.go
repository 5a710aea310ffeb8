package fleet

// Tests from a no-context review of the fleet limiter.

import (
	"bufio"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"dnsproxi/guard"
)

// Redis restarts (empty) and three instances come back to it one after
// another, as their once-a-second checks fall: the first sees a fleet of 1,
// the second of 2, the third of 3. Redis dies again before their next calls
// (a crash loop). Each falls back to a local share of the largest fleet it
// saw within a membership's life, a third each. With a share of the fleet
// last seen (the whole rate, a half, a third) the fleet sent 1.83 × the
// rate while Redis was dead, where TestFleetRedisKilled holds it to 1.1 ×.
func TestLocalSharesAfterRestartTakeTheLargestFleet(t *testing.T) {
	r := startRedis(t)
	const rate, n = 3000.0, 3
	limiters, clock, step := steppedFleet(t, r, rate, n, nil)

	r.kill()
	step() // each sees Redis gone
	r.restart()
	step() // each comes back in turn
	for i, l := range limiters {
		if l.Mode() != ModeShared {
			t.Fatalf("instance %d is %v after Redis came back", i, l.Mode())
		}
		t.Logf("instance %d came back and saw %d instances", i, l.Instances())
	}
	r.kill()
	step() // each sees Redis gone again

	// Ten seconds of load on the manual clock, each instance offered the
	// whole rate: what the local buckets let through.
	const seconds = 10
	admitted := 0
	for range seconds * 1000 {
		clock.Advance(time.Millisecond)
		for _, l := range limiters {
			for range int(rate / 1000) {
				if l.Allow(1) {
					admitted++
				}
			}
		}
	}
	var shares float64
	for i, l := range limiters {
		if l.Mode() != ModeLocal {
			t.Fatalf("instance %d is %v with Redis dead", i, l.Mode())
		}
		shares += rate / float64(max(l.Instances(), 1))
	}
	held := int64(n * 2 * int(rate/10)) // leases in hand at most
	t.Logf("with Redis dead: %d admitted in %d s = %.2f × rate; shares of the fleets last seen sum to %.0f/s", admitted, seconds, float64(admitted)/(rate*seconds), shares)
	if bound := 1.1*rate*seconds + float64(held); float64(admitted) > bound {
		t.Errorf("with Redis dead after a restart the fleet admitted %d in %d s, over 1.1 × rate × time + leases = %.0f: the local shares (%.0f/s) are taken from a fleet count seen while it was still gathering",
			admitted, seconds, bound, shares)
	}
}

// TestHostileRedisServer: a "Redis" on loopback that answers each command
// with one hostile reply — a malformed lease, too many tokens, a wrong
// type, an error, half a reply then a reset, nothing at all. The limiter
// neither panics nor over-admits: it stays local at its fallback, Allow
// never waits, and Close returns promptly. (It passes.)
func TestHostileRedisServer(t *testing.T) {
	replies := []struct {
		name  string
		reply string // sent for every command; "" sends nothing
		reset bool   // close the connection after the reply
	}{
		{"grants more than asked", "*2\r\n:999999999\r\n:1\r\n", false},
		{"negative grant", "*2\r\n:-5\r\n:1\r\n", false},
		{"no instances", "*2\r\n:1\r\n:0\r\n", false},
		{"one element", "*1\r\n:1\r\n", false},
		{"strings", "*2\r\n$1\r\nx\r\n$1\r\ny\r\n", false},
		{"nested", "*2\r\n*1\r\n:1\r\n:1\r\n", false},
		{"nil array", "*-1\r\n", false},
		{"error", "-ERR no\r\n", false},
		{"noscript forever", "-NOSCRIPT No matching script\r\n", false},
		{"huge array header", "*2147483647\r\n", true},
		{"half a reply then reset", "*2\r\n:5", true},
		{"garbage", "\x00\xff hello\r\n", false},
		{"never answers", "", false},
	}
	for _, c := range replies {
		t.Run(c.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			var conns sync.WaitGroup
			done := make(chan struct{})
			t.Cleanup(func() {
				close(done)
				ln.Close()
				conns.Wait()
			})
			conns.Go(func() {
				for {
					conn, err := ln.Accept()
					if err != nil {
						return
					}
					conns.Go(func() {
						defer conn.Close()
						go func() { <-done; conn.Close() }()
						br := bufio.NewReader(conn)
						buf := make([]byte, 4096)
						for {
							conn.SetReadDeadline(time.Now().Add(5 * time.Second))
							if _, err := br.Read(buf); err != nil {
								return
							}
							if c.reply == "" {
								continue
							}
							conn.Write([]byte(c.reply))
							if c.reset {
								if tc, ok := conn.(*net.TCPConn); ok {
									tc.SetLinger(0)
								}
								return
							}
						}
					})
				}
			})
			const rate = 1000.0
			l, err := New(Config{URL: "redis://" + ln.Addr().String() + "/0", Rate: rate, Fallback: 100, Timeout: 20 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			admitted := 0
			for time.Since(start) < 700*time.Millisecond {
				for range 100 {
					if l.Allow(1) {
						admitted++
					}
				}
				time.Sleep(time.Millisecond)
			}
			elapsed := time.Since(start).Seconds()
			if l.Mode() != ModeLocal {
				t.Errorf("mode %v against a hostile server", l.Mode())
			}
			if bound := 100 + 100*elapsed; float64(admitted) > bound {
				t.Errorf("admitted %d in %.2f s at a fallback of 100/s (bound %.0f)", admitted, elapsed, bound)
			}
			closed := make(chan error, 1)
			go func() { closed <- l.Close() }()
			select {
			case <-closed:
			case <-time.After(2 * time.Second):
				t.Fatal("Close did not return in 2 s")
			}
			t.Logf("admitted %d, calls %+v", admitted, l.RedisCalls())
		})
	}
}

// TestCheckURLRefusesWhatNoServerCanBe: a port outside 1..65535 or
// a negative database number can name no Redis server; CheckURL (which
// start-up uses to refuse DNS_UPSTREAM_RATE_LIMIT_REDIS with exit 2) must
// refuse them, as DNS_UPSTREAM's ports are, rather than start an instance
// whose every call fails and that runs on its fallback (by default the
// whole rate) for good.
func TestCheckURLRefusesWhatNoServerCanBe(t *testing.T) {
	for _, raw := range []string{
		"redis://127.0.0.1:99999",
		"redis://127.0.0.1:65536/0",
		"redis://127.0.0.1:0",
		"redis://127.0.0.1:6379/-1",
	} {
		if err := CheckURL(raw); err == nil {
			t.Errorf("CheckURL(%q) = nil, want a *URLError", raw)
		}
	}
}

// Redis frozen for 300 ms once every 1.5 s (a fork for a snapshot, a slow
// command, a VM pause: a slow Redis, not a dead one). At each freeze every
// instance's call times out and it spends its local share for about a
// second, until its next check, while the shared bucket on Redis (alive,
// its clock running) refills untouched. The call that reaches Redis again
// charges what was spent locally to the bucket, so the fleet stays within
// the slack TestFleetRedisKilled grants a run with one outage (two bursts
// and a second of the rate). Without the charge each freeze added up to a
// burst: 1.50 × the rate over the run.
func TestFrozenRedisAddsNoBurstPerFreeze(t *testing.T) {
	r := startRedis(t)
	const rate, n, freezes = 3000.0, 3, 6
	const burst = int(rate) // the default burst
	cfg := Config{URL: r.url(), Rate: rate}
	start := time.Now()
	var limiters []*Limiter
	for range n {
		l, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		limiters = append(limiters, l)
	}
	admitted := make([]atomic.Int64, n)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, l := range limiters {
		wg.Go(func() { offer(l, 3*rate/n, &admitted[i], stop) })
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	for range freezes {
		time.Sleep(1200 * time.Millisecond) // shared: the load runs
		r.signal(syscall.SIGSTOP)
		time.Sleep(300 * time.Millisecond)
		r.signal(syscall.SIGCONT)
	}
	time.Sleep(1200 * time.Millisecond)
	close(stop)
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	var total int64
	for i, l := range limiters {
		total += admitted[i].Load()
		t.Logf("instance %d: admitted %d, %d switches, calls %+v, mode %v", i, admitted[i].Load(), l.Switches(), l.RedisCalls(), l.Mode())
		if l.Switches() < 2 {
			t.Fatalf("instance %d switched %d times: the freezes did not reach it", i, l.Switches())
		}
	}
	maxBlock := int64(rate / 10)
	stated := rate*elapsed + float64(burst) + float64(n*2*maxBlock)
	slack := rate*elapsed + 2*float64(burst) + rate*1 + float64(n*2*maxBlock)
	t.Logf("%d freezes: the fleet admitted %d in %.2f s = %.2f × rate × time; stated bound %.0f, with one outage's slack %.0f",
		freezes, total, elapsed, float64(total)/(rate*elapsed), stated, slack)
	if float64(total) > slack {
		t.Errorf("the fleet admitted %d in %.2f s, over rate × time + 2 bursts + rate × 1 s + 2 blocks an instance = %.0f (the README's bound: %.0f): each freeze of a live Redis let the bucket's refill through on top of the local shares",
			total, elapsed, slack, stated)
	}
}

// steppedFleet starts n limiters of rate on r, on one manual clock (which
// it returns), with no goroutine: step advances the clock by a check's interval and runs each
// limiter's check, in turn. It has stepped once, and every limiter is
// shared with n instances. onSwitch, if not nil, hears instance i's mode
// switches.
func steppedFleet(t *testing.T, r *redisServer, rate float64, n int, onSwitch func(i int, sw Switch)) ([]*Limiter, *guard.ManualClock, func()) {
	t.Helper()
	clock := guard.NewManualClock(time.Unix(1_700_000_000, 0))
	var limiters []*Limiter
	for i := range n {
		cfg := Config{URL: r.url(), Rate: rate, Timeout: 2 * time.Second, Clock: clock}
		if onSwitch != nil {
			cfg.OnSwitch = func(sw Switch) { onSwitch(i, sw) }
		}
		l, err := newLimiter(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			close(l.done) // no goroutine to close it
			l.Close()
		})
		limiters = append(limiters, l)
	}
	step := func() {
		clock.Advance(checkInterval)
		for _, l := range limiters {
			l.step(clock.Now())
		}
	}
	step()
	for i, l := range limiters {
		if l.Mode() != ModeShared || l.Instances() != n {
			t.Fatalf("instance %d: mode %v, %d instances; want shared with %d", i, l.Mode(), l.Instances(), n)
		}
	}
	return limiters, clock, step
}
