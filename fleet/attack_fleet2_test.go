package fleet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestAttackRedactURLPasswordWithReservedChars: a password that was not
// percent-encoded and holds '/', '#' or '?' (a base64 password holds '/')
// makes the URL unparsable, and the start-up error must still not show it.
// RedactURL cuts the authority at the first '/', '?' or '#', finds no '@'
// before it, and returns the URL whole.
func TestAttackRedactURLPasswordWithReservedChars(t *testing.T) {
	cases := []struct{ url, secret string }{
		{"redis://:pa/zq9@127.0.0.1:6379/0", "pa/zq9"},
		{"redis://user:Zm9v/YmFy+cXV4==@10.0.0.5:6379/0", "Zm9v/YmFy+cXV4=="},
		{"redis://:ab#cd@127.0.0.1:6379", "ab#cd"},
		{"redis://:ab?cd@127.0.0.1:6379", "ab?cd"},
	}
	for _, c := range cases {
		t.Run(c.url, func(t *testing.T) {
			// The secret's tail (after the reserved byte) is enough to leak it.
			_, tail, _ := strings.Cut(c.secret, string(c.secret[strings.IndexAny(c.secret, "/#?")]))
			if got := RedactURL(c.url); strings.Contains(got, tail) {
				t.Errorf("RedactURL(%q) = %q: shows the password", c.url, got)
			}
			err := CheckURL(c.url)
			if err == nil {
				t.Fatalf("CheckURL(%q) accepted it", c.url)
			}
			if strings.Contains(err.Error(), tail) {
				t.Errorf("CheckURL error shows the password: %v", err)
			}
			if _, err := New(Config{URL: c.url, Rate: 10}); err == nil || strings.Contains(err.Error(), tail) {
				t.Errorf("New error shows the password: %v", err)
			}
		})
	}
}

// hostileRedis listens on 127.0.0.1 and answers every read with reply.
func hostileRedis(t *testing.T, reply string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	done := make(chan struct{})
	t.Cleanup(func() { close(done); ln.Close(); conns.Wait() })
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
					conn.Write([]byte(reply))
				}
			})
		}
	})
	return "redis://" + ln.Addr().String() + "/0"
}

// TestAttackHugeArrayLengthDoesNotCrash: a "Redis" (or anything that
// answers on its port, or someone on the path of a plain redis:// link)
// that answers an array header of 10^9 elements. go-redis sizes what it
// reads by the header before it reads one element (here the map of the
// connection's handshake reply): a fatal "out of memory" that no recover
// catches, and the whole proxy dies (TestHostileRedisServer's 2^31-1, sent
// once before a reset, passes). Run in a child process, since the failure
// is a crash.
func TestAttackHugeArrayLengthDoesNotCrash(t *testing.T) {
	if os.Getenv("ATTACK_HUGE_ARRAY_CHILD") == "1" {
		// 4 GB of address space: the failure is a fatal out of memory
		// rather than a machine-wide squeeze (without it the process
		// took 13 GB and hung in the make).
		if err := syscall.Setrlimit(syscall.RLIMIT_AS, &syscall.Rlimit{Cur: 4 << 30, Max: 4 << 30}); err != nil {
			t.Fatal(err)
		}
		url := hostileRedis(t, "*1000000000\r\n")
		l, err := New(Config{URL: url, Rate: 1000, Fallback: 100, Timeout: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(1500 * time.Millisecond)
		for time.Now().Before(deadline) {
			l.Allow(1)
			time.Sleep(time.Millisecond)
		}
		l.Close()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestAttackHugeArrayLengthDoesNotCrash$", "-test.count=1")
	if raceEnabled {
		// The race detector's shadow memory does not fit under the
		// child's address-space limit: the child is built without it.
		cmd = exec.CommandContext(ctx, "go", "test", "-count=1", "-run=^TestAttackHugeArrayLengthDoesNotCrash$", ".")
	}
	cmd.Env = append(os.Environ(), "ATTACK_HUGE_ARRAY_CHILD=1")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) || err != nil {
		first := string(out)
		if i := strings.Index(first, "\n\ngoroutine "); i > 0 {
			first = first[:i]
		}
		t.Fatalf("the process died on an array header of 10^9 from Redis: %v\n%s", err, first)
	}
}

// TestAttackIdleReservesStarveTheBusyInstance: at a low fleet rate the
// reserve is clamped up to 1 token, so each idle instance keeps leasing a
// token, lets it expire unspent 900 ms later and leases the next: the
// README's "the fleet's idle reserves together take at most reserveSpan of
// the rate per lease, about 1.25% of it" becomes about 1.1 tokens a second
// per idle instance. Seven instances share 5/s; six are idle, one is
// offered 2/s (40% of the contract, and the only traffic of the fleet). It
// should send all of it.
func TestAttackIdleReservesStarveTheBusyInstance(t *testing.T) {
	r := startRedis(t)
	url := r.url()
	const rate, offered, run = 5.0, 2.0, 6 * time.Second
	var ls []*Limiter
	for range 7 {
		l, err := New(Config{URL: url, Rate: rate})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		ls = append(ls, l)
	}
	_ = r
	var admitted atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { offer(ls[0], offered, &admitted, stop) })
	time.Sleep(run) // the span the load runs; the wait is the measurement
	close(stop)
	wg.Wait()
	want := int64(offered * run.Seconds())
	for i, l := range ls {
		t.Logf("admitted %d; instance %d: mode %v, instances %d, lease %d, calls %+v", admitted.Load(), i, l.Mode(), l.Instances(), l.LeaseTokens(), l.RedisCalls())
	}
	if got := admitted.Load(); got < want*9/10 {
		t.Errorf("the busy instance sent %d of %d queries offered at %.0f/s, with the fleet's contract at %.0f/s and nobody else sending: %d refused",
			got, want, offered, rate, want-got)
	}
}

// TestAttackLoneInstanceBelowOneTokenASecondRefused: with a refill slower
// than a lease's life (rate below about 1.1/s; the range goes down to
// 0.001), a lone idle instance leases the bucket's one token as its
// reserve, lets it expire unspent after 900 ms, and the bucket is empty
// until the next refill: for about 1.1 s of every 2 the instance holds
// nothing, and a query then is refused though the instance has sent
// nothing for seconds. A local bucket of the same rate, idle, holds its
// token all the time. Rate 0.5/s, burst 1: after 2.5 s idle, the lease is
// watched every 50 ms for 4 s; the first time it is empty, one query is
// asked for.
func TestAttackLoneInstanceBelowOneTokenASecondRefused(t *testing.T) {
	r := startRedis(t)
	l, err := New(Config{URL: r.url(), Rate: 0.5, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	time.Sleep(2500 * time.Millisecond) // idle: a local bucket would be full by now
	var seen strings.Builder
	empty := 0
	for range 80 {
		time.Sleep(50 * time.Millisecond)
		held := l.LeaseTokens()
		fmt.Fprint(&seen, held)
		if held == 0 {
			empty++
			if empty == 1 && !l.Allow(1) {
				t.Errorf("a query after 2.5 s of idle refused, mode %v, calls %+v", l.Mode(), l.RedisCalls())
			}
		}
	}
	if empty > 0 {
		t.Errorf("idle at 0.5/s, the lone instance held no token at %d of 80 looks 50 ms apart (%s); %d Redis calls in 6.5 s",
			empty, seen.String(), l.begun.Load())
	}
}
