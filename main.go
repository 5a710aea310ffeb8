// Command dnsproxi is a DNS forwarding proxy with guard gates: an access
// list (DNS_ALLOW, local and private networks by default), a token bucket
// per client (DNS_CLIENT_RATE_LIMIT) and one shared by all (DNS_RATE_LIMIT)
// that refuse traffic beyond a rate, and a circuit breaker that stops
// sending to an upstream that keeps failing (DNS_BREAKER_THRESHOLD). The
// buckets and the breaker are off by default. Run dnsproxi -h for the
// variables. With DNS_CACHE_SIZE set it answers from a cache, serves stale
// answers while no upstream can answer (DNS_CACHE_STALE, RFC 8767), and POST
// /cache/flush on the metrics listener, from loopback, empties the cache.
// SIGINT or SIGTERM stops it once the queries in flight are answered; SIGHUP
// is logged and changes nothing.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"dnsproxi/dnsserver"
	"dnsproxi/guard"
	"dnsproxi/metrics"
	"dnsproxi/upstream"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr, nil))
}

// run is main without the process around it: it returns the exit code, and
// calls ready (if set) with the running app once it is listening.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, ready func(*app)) int {
	// SIGHUP, whose default is to end the process, is taken from the start.
	hangup := make(chan os.Signal, 1)
	signal.Notify(hangup, syscall.SIGHUP)
	defer signal.Stop(hangup)

	for _, a := range args {
		switch a {
		case "-h", "-help", "--help":
			fmt.Fprint(stdout, usage())
			return 0
		default:
			fmt.Fprintf(stderr, "dnsproxi: unexpected argument %q: it is configured through DNS_* variables (dnsproxi -h)\n", a)
			return 2
		}
	}
	cfg, err := loadConfig()
	if err != nil {
		fmt.Fprintf(stderr, "dnsproxi: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	a, err := newApp(cfg, guard.RealClock{}, log)
	if err != nil {
		fmt.Fprintf(stderr, "dnsproxi: %v\n", err)
		return 1
	}
	if err := a.start(); err != nil {
		fmt.Fprintf(stderr, "dnsproxi: %v\n", err)
		return 1
	}
	log.Info("listening", "listen", a.server.LocalAddr().String(), "upstream", cfg.Upstream,
		"upstream_timeout", cfg.UpstreamTimeout, "rate_limit", cfg.RateLimit.String(),
		"breaker", breakerSummary(cfg), "max_inflight", cfg.MaxInflight,
		"tcp_max_conns", cfg.TCPMaxConns, "tcp_idle_timeout", cfg.TCPIdleTimeout,
		"max_udp_size", cfg.MaxUDPSize, "upstream_0x20", cfg.Upstream0x20, "metrics", a.metricsURL(),
		"allow", cfg.Allow.String(), "client_rate_limit", clientSummary(cfg), "limit_action", cfg.LimitAction.String(),
		"cache", cacheSummary(cfg))
	if cfg.Allow.Any {
		log.Warn("DNS_ALLOW=any: the access list is open, every address may query; on a public address this is an open resolver")
	}
	if ready != nil {
		ready(a)
	}
serving:
	for {
		select {
		case <-ctx.Done():
			break serving
		case <-hangup:
			a.reopen()
		}
	}
	log.Info("shutting down: finishing the queries in flight")
	sctx, cancel := context.WithTimeout(context.Background(), cfg.UpstreamTimeout+time.Second)
	defer cancel()
	if err := a.shutdown(sctx); err != nil {
		log.Warn("shutdown cut short", "err", err)
	}
	log.Info("stopped")
	return 0
}

// clientSummary describes the per-client gate for the start-up log.
func clientSummary(cfg Config) string {
	if !cfg.ClientRateLimit.On() {
		return "off"
	}
	return fmt.Sprintf("%s per prefix /%s, table %d, exempt %s",
		cfg.ClientRateLimit, cfg.ClientPrefix, cfg.ClientTableSize, cfg.ClientExempt)
}

func breakerSummary(cfg Config) string {
	if cfg.BreakerThreshold == 0 {
		return "off"
	}
	return fmt.Sprintf("%d%% of the last %d (min %d), cool-off %v",
		cfg.BreakerThreshold, cfg.BreakerWindow, cfg.BreakerMinSamples, cfg.BreakerCoolOff)
}

// app is one running proxy: its gates, upstream, DNS server and metrics.
type app struct {
	cfg         Config
	log         *slog.Logger
	metrics     *metrics.Metrics
	proxy       *proxy
	upstream    *upstream.Upstream
	server      *dnsserver.Server
	metricsLn   net.Listener
	metricsHTTP *http.Server
}

// newApp builds the proxy from cfg, reading time from clock.
func newApp(cfg Config, clock guard.Clock, log *slog.Logger) (*app, error) {
	m := metrics.New()
	limiter, breaker := initGuard(cfg, clock)
	if breaker != nil {
		breaker.OnStateChange(func(from, to guard.State) {
			m.BreakerChanges.WithLabelValues(from.String(), to.String()).Inc()
			m.BreakerState.Set(float64(to)) // guard.State counts closed, half-open, open: as metrics.States
			log.Info("breaker", "from", from.String(), "to", to.String())
		})
	}
	up, err := upstream.New(upstream.Config{
		Addr:        cfg.Upstream,
		Timeout:     cfg.UpstreamTimeout,
		Disable0x20: !cfg.Upstream0x20,
		AvoidPorts:  ownPorts(cfg),
		OnCaseFallback: func() {
			log.Warn("upstream does not echo the query name's letter case: 0x20 is off for it from now on",
				"upstream", cfg.Upstream)
		},
	})
	if err != nil {
		return nil, err
	}
	access, denied, clients := initAccess(cfg, clock)
	m.WatchClients(clientStats(clients))
	m.WatchUpstream(func() metrics.UpstreamStats {
		s := up.Stats()
		return metrics.UpstreamStats{CaseMismatches: s.CaseMismatches, Rotations: s.Rotations,
			Case0x20: cfg.Upstream0x20 && !s.PlainCase}
	})
	answers, err := newAnswerCache(cfg, clock, m)
	if err != nil {
		up.Close()
		return nil, err
	}
	p := &proxy{access: access, denied: denied, clients: clients, limiter: limiter, action: cfg.LimitAction,
		breaker: breaker, maxInflight: int64(cfg.MaxInflight), maxUDPSize: cfg.MaxUDPSize, upstream: up, metrics: m,
		cache: answers}
	a := &app{cfg: cfg, log: log, metrics: m, proxy: p, upstream: up}
	a.server = &dnsserver.Server{
		Addr:           cfg.Listen,
		Handler:        dnsserver.HandlerFunc(p.handleQuery),
		MaxUnanswered:  maxUnanswered(cfg.MaxInflight),
		MaxTCPConns:    cfg.TCPMaxConns,
		TCPIdleTimeout: cfg.TCPIdleTimeout,
		OnDropped:      func(reason string) { m.Dropped.WithLabelValues(reason).Inc() },
	}
	return a, nil
}

// maxUnanswered bounds the queries the server holds unanswered: room for every
// query the cap lets through to the upstream, plus as many again being
// answered at once. With the cap off, a fixed safety bound remains.
func maxUnanswered(maxInflight int) int {
	switch {
	case maxInflight == 0:
		return unlimitedPending
	case maxInflight > (math.MaxInt-1024)/2:
		return math.MaxInt // configuration bounds the cap far below; never wrap
	}
	return 2*maxInflight + 1024
}

// unlimitedPending is the server's bound when DNS_MAX_INFLIGHT=0.
const unlimitedPending = 65536

// initGuard builds the gates the configuration asks for; nil means off.
func initGuard(cfg Config, clock guard.Clock) (*guard.TokenBucket, *guard.Breaker) {
	var limiter *guard.TokenBucket
	if cfg.RateLimit.On() {
		limiter = guard.NewTokenBucket(cfg.RateLimit.Rate, cfg.RateLimit.Burst, clock)
	}
	var breaker *guard.Breaker
	if cfg.BreakerThreshold > 0 {
		breaker = guard.NewBreaker(guard.BreakerConfig{
			Window:        cfg.BreakerWindow,
			MinSamples:    cfg.BreakerMinSamples,
			FailThreshold: float64(cfg.BreakerThreshold) / 100,
			CoolOff:       cfg.BreakerCoolOff,
		}, clock)
	}
	return limiter, breaker
}

// start binds the metrics listener and the DNS server.
func (a *app) start() error {
	if a.cfg.MetricsAddr != "off" {
		ln, err := net.Listen("tcp", a.cfg.MetricsAddr)
		if err != nil {
			a.upstream.Close()
			return fmt.Errorf("DNS_METRICS_ADDR=%q: %v", a.cfg.MetricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", a.metrics.Handler())
		if a.proxy.cache != nil {
			mux.Handle(flushPath, a.flushHandler()) // admin.go
		}
		a.metricsLn = ln
		a.metricsHTTP = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go a.metricsHTTP.Serve(ln)
	}
	if err := a.server.Start(); err != nil {
		a.upstream.Close()
		if a.metricsHTTP != nil {
			a.metricsHTTP.Close()
		}
		return fmt.Errorf("DNS_LISTEN=%q: %v", a.cfg.Listen, err)
	}
	return nil
}

// reopen is what SIGHUP asks for: files reopened after a log rotation.
// None is open yet, so the proxy says so and goes on serving.
func (a *app) reopen() {
	a.log.Info("SIGHUP: nothing to reopen or reload; still serving")
}

// metricsURL is where /metrics is served, or "off".
func (a *app) metricsURL() string {
	if a.metricsLn == nil {
		return "off"
	}
	return "http://" + a.metricsLn.Addr().String() + "/metrics"
}

// shutdown stops taking queries, lets those in flight finish, then closes everything.
func (a *app) shutdown(ctx context.Context) error {
	err := a.server.Shutdown(ctx)
	if a.metricsHTTP != nil {
		if herr := a.metricsHTTP.Shutdown(ctx); herr != nil && !errors.Is(herr, http.ErrServerClosed) {
			err = errors.Join(err, herr)
		}
	}
	a.upstream.Close()
	return err
}

// ownPorts are the ports the proxy listens on, which its upstream sockets
// must not take as source ports before the listeners bind them.
func ownPorts(cfg Config) []uint16 {
	var ports []uint16
	for _, addr := range []string{cfg.Listen, cfg.MetricsAddr} {
		if ap, err := netip.ParseAddrPort(addr); err == nil && ap.Port() != 0 {
			ports = append(ports, ap.Port())
		}
	}
	return ports
}
