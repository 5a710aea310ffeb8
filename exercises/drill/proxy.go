package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"dnsproxi/metrics"
)

// buildProxy builds the dnsproxi binary from the module this drill belongs
// to (or returns $DRILL_PROXY if set), so the drill runs exactly what users run.
func buildProxy(dir string) (string, error) {
	if p := os.Getenv("DRILL_PROXY"); p != "" {
		return p, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "dnsproxi")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building dnsproxi: %v\n%s", err, out)
	}
	return bin, nil
}

// moduleRoot finds the directory of dnsproxi's go.mod, from here upwards.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(b), "module dnsproxi\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run the drill from inside the dnsproxi repository (or set DRILL_PROXY)")
		}
		dir = parent
	}
}

// freePort returns a loopback port that was free for both UDP and TCP a moment ago.
func freePort() (int, error) {
	for range 20 {
		u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			return 0, err
		}
		port := u.LocalAddr().(*net.UDPAddr).Port
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		u.Close()
		if err == nil {
			l.Close()
			return port, nil
		}
	}
	return 0, errors.New("no free port")
}

// proxyProcess is a running dnsproxi.
type proxyProcess struct {
	cmd     *exec.Cmd
	Addr    string // DNS host:port
	Metrics string // /metrics URL
	done    chan error

	mu  sync.Mutex
	log strings.Builder
}

// startProxy runs bin with env (DNS_* variables) plus free listen and
// metrics ports, and waits until it says it is listening.
func startProxy(bin string, env map[string]string) (*proxyProcess, error) {
	dnsPort, err := freePort()
	if err != nil {
		return nil, err
	}
	// A port freed a moment ago may be handed out again at once: the two
	// must differ, or the proxy refuses to start (both on TCP).
	metricsPort := dnsPort
	for i := 0; i < 20 && metricsPort == dnsPort; i++ {
		if metricsPort, err = freePort(); err != nil {
			return nil, err
		}
	}
	if metricsPort == dnsPort {
		return nil, errors.New("no second free port")
	}
	p := &proxyProcess{
		Addr:    fmt.Sprintf("127.0.0.1:%d", dnsPort),
		Metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort),
		done:    make(chan error, 1),
	}
	p.cmd = exec.Command(bin)
	p.cmd.Env = append(os.Environ(), "DNS_LISTEN="+p.Addr, fmt.Sprintf("DNS_METRICS_ADDR=127.0.0.1:%d", metricsPort))
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := sync.Once{}
		for sc.Scan() {
			p.mu.Lock()
			p.log.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			if strings.Contains(sc.Text(), "msg=listening") {
				once.Do(func() { close(listening) })
			}
		}
		io.Copy(io.Discard, stderr)
		p.done <- p.cmd.Wait()
	}()
	select {
	case <-listening:
		return p, nil
	case err := <-p.done:
		return nil, fmt.Errorf("dnsproxi exited at start (%v):\n%s", err, p.Log())
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		return nil, fmt.Errorf("dnsproxi did not start listening:\n%s", p.Log())
	}
}

// Log returns what the proxy has logged so far.
func (p *proxyProcess) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// Stop sends SIGTERM and waits (bounded) for the exit.
func (p *proxyProcess) Stop() error {
	p.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-p.done:
		return err
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		return errors.New("dnsproxi did not stop within 10s; killed")
	}
}

// metricLine matches one sample of the text exposition format.
var metricLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)`)

// Scrape is one reading of /metrics.
type Scrape map[string]float64 // "name{labels}" → value

// scrape reads the proxy's /metrics.
func (p *proxyProcess) scrape(ctx context.Context) (Scrape, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.Metrics, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	s := Scrape{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		m := metricLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			continue
		}
		s[m[1]+m[2]] += v
	}
	return s, sc.Err()
}

// Outcome sums dnsproxi_queries_total over query types for one outcome.
func (s Scrape) Outcome(outcome string) int {
	total := 0.0
	for k, v := range s {
		if strings.HasPrefix(k, "dnsproxi_queries_total{") && strings.Contains(k, `outcome="`+outcome+`"`) {
			total += v
		}
	}
	return int(total)
}

// Queries sums dnsproxi_queries_total over every outcome and query type:
// the queries the proxy has counted.
func (s Scrape) Queries() int {
	total := 0.0
	for k, v := range s {
		if strings.HasPrefix(k, "dnsproxi_queries_total{") {
			total += v
		}
	}
	return int(total)
}

// Get returns one sample by its full name, labels included.
func (s Scrape) Get(name string) float64 { return s[name] }

// Transitions sums dnsproxi_breaker_transitions_total{from,to} over the upstreams.
func (s Scrape) Transitions(from, to string) int {
	total := 0.0
	for k, v := range s {
		name, labels := splitSample(k)
		if name == "dnsproxi_breaker_transitions_total" && labels["from"] == from && labels["to"] == to {
			total += v
		}
	}
	return int(total)
}

// TransitionsOf returns dnsproxi_breaker_transitions_total{upstream,from,to}.
func (s Scrape) TransitionsOf(upstream, from, to string) int {
	return int(s[fmt.Sprintf(`dnsproxi_breaker_transitions_total{from="%s",to="%s",upstream="%s"}`, from, to, upstream)])
}

// BreakerState names the breaker_state gauge of the proxy's one upstream;
// "?" if there is not exactly one.
func (s Scrape) BreakerState() string {
	state, n := "?", 0
	for k := range s {
		if name, labels := splitSample(k); name == "dnsproxi_breaker_state" {
			state = s.BreakerStateOf(labels["upstream"])
			n++
		}
	}
	if n != 1 {
		return "?"
	}
	return state
}

// BreakerStateOf names one upstream's breaker_state gauge.
func (s Scrape) BreakerStateOf(upstream string) string {
	v, ok := s[`dnsproxi_breaker_state{upstream="`+upstream+`"}`]
	if i := int(v); ok && i >= 0 && i < len(metrics.States) {
		return metrics.States[i]
	}
	return "?"
}

// labelPair matches one label of a sample: name="value".
var labelPair = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"`)

// splitSample splits a Scrape key into the metric's name and its labels.
func splitSample(key string) (string, map[string]string) {
	name, rest, _ := strings.Cut(key, "{")
	labels := map[string]string{}
	for _, m := range labelPair.FindAllStringSubmatch(rest, -1) {
		labels[m[1]] = m[2]
	}
	return name, labels
}
