package fleet

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"dnsproxi/internal/redisproc"
)

// redisServer is a redis-server this test started on a free loopback port,
// without persistence, stopped by t.Cleanup (internal/redisproc does the
// starting and stopping for every package's tests).
type redisServer struct {
	t testing.TB
	s *redisproc.Server
}

// startRedis starts redis-server from PATH and waits until it says it
// accepts connections. A missing redis-server fails the test: no test skips
// for want of it.
func startRedis(t testing.TB, extra ...string) *redisServer {
	t.Helper()
	s, err := redisproc.Start(extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Kill)
	return &redisServer{t: t, s: s}
}

// url is the server's redis:// URL.
func (r *redisServer) url() string { return r.s.URL() }

// client is a plain client for the test's own look at the server.
func (r *redisServer) client() *redis.Client {
	r.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.s.Port), Protocol: 2,
		DisableIdentity: true, ReadTimeout: 5 * time.Second, MaxRetries: -1})
	r.t.Cleanup(func() { c.Close() })
	return c
}

// kill ends the server at once (SIGKILL, after SIGCONT if it was stopped).
func (r *redisServer) kill() { r.s.Kill() }

// restart starts the server again on the same port, its data gone.
func (r *redisServer) restart() {
	r.t.Helper()
	if err := r.s.Restart(); err != nil {
		r.t.Fatal(err)
	}
}

// signal sends sig (SIGSTOP or SIGCONT) to the running server.
func (r *redisServer) signal(sig syscall.Signal) {
	r.t.Helper()
	var err error
	switch sig {
	case syscall.SIGSTOP:
		err = r.s.Stop()
	case syscall.SIGCONT:
		err = r.s.Continue()
	default:
		err = fmt.Errorf("signal %v: only SIGSTOP and SIGCONT", sig)
	}
	if err != nil {
		r.t.Fatalf("signal %v to redis-server: %v", sig, err)
	}
}

// redisTime reads the server's clock, the one the script refills by.
func redisTime(t *testing.T, c *redis.Client) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now
}

// scriptCalls counts the scripts the server ran (EVALSHA and EVAL), as the
// server itself counts them.
func scriptCalls(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("INFO commandstats line %q: %v", line, err)
		}
		total += n
	}
	return total
}

// freePort finds a loopback TCP port nobody listens on now: where no Redis is.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
