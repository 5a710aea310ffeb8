package fleet

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
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
		{"redis://:pa/sZq9@127.0.0.1:6379/0", "pa/sZq9"}, // a tail "ss" would match the error's own word "password"
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
