// Package redisproc runs a redis-server of its own for the tests and the
// drills: on a free loopback port, without persistence, until Kill. It
// stops, continues, kills and restarts it on command, so that what the
// fleet limiter does when Redis dies or hangs can be shown for real.
package redisproc

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// readyTimeout bounds the wait for a starting server to accept connections.
const readyTimeout = 10 * time.Second

// Server is one redis-server process. Its methods are for one goroutine.
type Server struct {
	// Port is the loopback TCP port it listens on, the same across restarts.
	Port int
	args []string
	cmd  *exec.Cmd
	out  *readyWatcher
}

// Start runs redis-server from PATH on a free loopback port, with extra
// arguments after the package's own, and returns once it accepts
// connections (at most 10 s). A missing redis-server is an error saying
// how to install it.
func Start(extra ...string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server is not on PATH (apt-get install -y redis-server): %v", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &Server{Port: port}
	s.args = append([]string{bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--logfile", "", "--daemonize", "no"}, extra...)
	return s, s.start()
}

// URL is the server's redis:// URL, database 0.
func (s *Server) URL() string { return fmt.Sprintf("redis://127.0.0.1:%d/0", s.Port) }

// Kill ends the server at once (SIGKILL, after SIGCONT if it was stopped)
// and waits for it. It does nothing if the server is not running.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGCONT)
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}

// Restart kills the server if it runs and starts it again on the same
// port, its data gone.
func (s *Server) Restart() error {
	s.Kill()
	return s.start()
}

// Stop freezes the server (SIGSTOP): the kernel still accepts its
// connections, and nothing is answered until Continue.
func (s *Server) Stop() error { return s.signal(syscall.SIGSTOP) }

// Continue lets a stopped server run again (SIGCONT).
func (s *Server) Continue() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	if s.cmd == nil {
		return errors.New("redis-server is not running")
	}
	return s.cmd.Process.Signal(sig)
}

// start runs the process and waits for its readiness line.
func (s *Server) start() error {
	w := &readyWatcher{ready: make(chan struct{})}
	cmd := exec.Command(s.args[0], s.args[1:]...)
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %v", err)
	}
	s.cmd, s.out = cmd, w
	select {
	case <-w.ready:
		return nil
	case <-time.After(readyTimeout):
		s.Kill()
		return fmt.Errorf("redis-server on port %d not ready within %v:\n%s", s.Port, readyTimeout, w.String())
	}
}

// freePort finds a loopback TCP port nobody listens on now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// readyWatcher takes redis-server's output and closes ready at the line
// saying it accepts connections. It keeps the first 8 KiB for an error.
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
