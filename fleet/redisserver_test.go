package fleet

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a redis-server this test started on a free loopback port,
// without persistence, stopped by t.Cleanup.
type redisServer struct {
	t    testing.TB
	port int
	cmd  *exec.Cmd
	args []string
}

// startRedis starts redis-server from PATH and waits (at most 10 s) until it
// says it accepts connections. A missing redis-server fails the test: no
// test skips for want of it.
func startRedis(t testing.TB, extra ...string) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redis-server is not on PATH (apt-get install -y redis-server): %v", err)
	}
	r := &redisServer{t: t, port: freePort(t)}
	r.args = append([]string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--logfile", "", "--daemonize", "no"}, extra...)
	r.args = append([]string{bin}, r.args...)
	r.start()
	t.Cleanup(r.kill)
	return r
}

// freePort finds a loopback TCP port nobody listens on now.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// start runs the server and waits for its readiness line.
func (r *redisServer) start() {
	r.t.Helper()
	w := &readyWatcher{ready: make(chan struct{})}
	cmd := exec.Command(r.args[0], r.args[1:]...)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("starting redis-server: %v", err)
	}
	r.cmd = cmd
	select {
	case <-w.ready:
	case <-time.After(10 * time.Second):
		r.kill()
		r.t.Fatalf("redis-server on port %d not ready within 10 s:\n%s", r.port, w.String())
	}
}

// readyWatcher takes redis-server's output and closes ready at the line
// saying it accepts connections. It keeps the first 8 KiB for a failure's message.
type readyWatcher struct {
	mu    sync.Mutex
	head  []byte
	tail  []byte // an unfinished line
	ready chan struct{}
	seen  bool
}

func (w *readyWatcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.head) < 8192 {
		w.head = append(w.head, p[:min(len(p), 8192-len(w.head))]...)
	}
	if w.seen {
		return len(p), nil
	}
	w.tail = append(w.tail, p...)
	if bytes.Contains(w.tail, []byte("Ready to accept connections")) {
		w.seen = true
		close(w.ready)
	}
	if i := bytes.LastIndexByte(w.tail, '\n'); i >= 0 {
		w.tail = append(w.tail[:0], w.tail[i+1:]...)
	}
	return len(p), nil
}

func (w *readyWatcher) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.head)
}

// url is the server's redis:// URL.
func (r *redisServer) url() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", r.port) }

// client is a plain client for the test's own look at the server.
func (r *redisServer) client() *redis.Client {
	r.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port), Protocol: 2,
		DisableIdentity: true, ReadTimeout: 5 * time.Second, MaxRetries: -1})
	r.t.Cleanup(func() { c.Close() })
	return c
}

// kill ends the server at once (SIGKILL, after SIGCONT if it was stopped).
func (r *redisServer) kill() {
	if r.cmd == nil {
		return
	}
	r.cmd.Process.Signal(syscall.SIGCONT)
	r.cmd.Process.Kill()
	r.cmd.Wait()
	r.cmd = nil
}

// restart starts the server again on the same port, its data gone.
func (r *redisServer) restart() {
	r.t.Helper()
	r.kill()
	r.start()
}

// signal sends sig to the running server.
func (r *redisServer) signal(sig syscall.Signal) {
	r.t.Helper()
	if err := r.cmd.Process.Signal(sig); err != nil {
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
