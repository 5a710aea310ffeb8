// Command dnsproxi is a DNS forwarding proxy with guard gates: an access
// list (DNS_ALLOW, local and private networks by default), a token bucket
// per client (DNS_CLIENT_RATE_LIMIT) and one shared by all (DNS_RATE_LIMIT)
// that refuse traffic beyond a rate, and a circuit breaker per upstream that
// stops sending to an upstream that keeps failing (DNS_BREAKER_THRESHOLD).
// It forwards to one upstream or to several (DNS_UPSTREAM is a list),
// retrying and hedging at the next one within a budget (DNS_RETRY_BUDGET)
// and one deadline. The buckets and the breakers are off by default. Run
// dnsproxi -h for the variables. SIGINT or SIGTERM stops it once the queries
// in flight are answered; SIGHUP reopens the query log's file
// (DNS_QUERY_LOG), for log rotation. dnsproxi -version prints the build's
// version and commit. With DNS_CACHE_SIZE set it answers from a cache,
// serves stale answers while no upstream can answer (DNS_CACHE_STALE, RFC
// 8767), and POST /cache/flush on the metrics listener, from loopback,
// empties the cache.
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
	"sync/atomic"
	"syscall"
	"time"

	"dnsproxi/dnsserver"
	"dnsproxi/guard"
	"dnsproxi/internal/batchio"
	"dnsproxi/metrics"
	"dnsproxi/pool"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// Once every UDP socket is open (one a core), the P count follows the
	// load, and on one P the UDP queries go to one socket (procs.go).
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr, func(a *app) {
		if most := adaptProcs(ctx, focusLogged(a.eventLog, a.server.FocusUDP)); most > 0 {
			a.eventLog.Info("GOMAXPROCS follows the load: 1 until one thread is busy, then the default", "max", most)
		}
	}))
}

// run is main without the process around it: it returns the exit code, and
// calls ready (if set) with the running app once it is listening.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, ready func(*app)) int {
	// SIGHUP, whose default is to end the process, is taken from the start.
	hangup := make(chan os.Signal, 1)
	signal.Notify(hangup, syscall.SIGHUP)
	defer signal.Stop(hangup)
	// A log line written to a stderr whose reader has gone must cost the
	// line, not the process: unless SIGPIPE is ignored, Go ends a program
	// whose write to fd 1 or 2 meets a broken pipe.
	signal.Ignore(syscall.SIGPIPE)

	for _, a := range args {
		switch a {
		case "-h", "-help", "--help":
			fmt.Fprint(stdout, usage())
			return 0
		case "-version", "--version":
			fmt.Fprintln(stdout, readBuildVersion())
			return 0
		default:
			fmt.Fprintf(stderr, "dnsproxi: unexpected argument %q: it is configured through DNS_* variables (dnsproxi -h)\n", a)
			return 2
		}
	}
	cfg, err := loadConfig()
	if err != nil {
		fmt.Fprintf(stderr, "dnsproxi: %v\n", err)
		if errors.As(err, new(*lookupError)) {
			return 1
		}
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	a, err := newApp(cfg, guard.RealClock{}, log)
	if err != nil {
		fmt.Fprintf(stderr, "dnsproxi: %v\n", err)
		if errors.As(err, new(*configError)) {
			return 2
		}
		return 1
	}
	if err := a.start(); err != nil {
		fmt.Fprintf(stderr, "dnsproxi: %v\n", err)
		return 1
	}
	// The start-up lines go through the queue, as the signal loop's do: a
	// stderr stalled since start-up must not keep run from the loop, where
	// SIGTERM is heard (TestAttackStderrStalledAtStartIgnoresSIGTERM).
	if w := cfg.loweredWarning(); w != "" { // once started: an error above is the one line printed
		a.eventLog.Warn(w)
	}
	for _, u := range unknownVariables(os.Environ()) {
		if u[1] != "" {
			a.eventLog.Warn("not a dnsproxi variable, ignored", "variable", u[0], "did_you_mean", u[1])
		} else {
			a.eventLog.Warn("not a dnsproxi variable, ignored", "variable", u[0])
		}
	}
	a.eventLog.Info("listening", "listen", a.server.LocalAddr().String(), "upstream", cfg.Upstream,
		"upstream_timeout", cfg.UpstreamTimeout, "failover", failoverSummary(cfg), "rate_limit", cfg.RateLimit.String(), "upstream_rate_limit", outboundSummary(cfg),
		"breaker", breakerSummary(cfg), "max_inflight", cfg.MaxInflight,
		"tcp_max_conns", cfg.TCPMaxConns, "tcp_idle_timeout", cfg.TCPIdleTimeout,
		"max_udp_size", cfg.MaxUDPSize, "upstream_0x20", cfg.Upstream0x20, "metrics", a.metricsURL(),
		"allow", cfg.Allow.String(), "client_rate_limit", clientSummary(cfg), "limit_action", cfg.LimitAction.String(),
		"query_log", cfg.QueryLog.String(), "query_log_sample", float64(cfg.QueryLogSample),
		"cache", cacheSummary(cfg))
	if families := cfg.Allow.open(); families != "" {
		a.eventLog.Warn("DNS_ALLOW: the access list is open, every "+families+" address may query; on a public address this is an open resolver",
			"allow", cfg.Allow.String())
	}
	notifySocket := os.Getenv("NOTIFY_SOCKET")
	if err := notifyServiceManager(notifySocket, "READY=1\nSTATUS=answering on "+a.server.LocalAddr().String()); err != nil {
		a.eventLog.Warn("NOTIFY_SOCKET: the service manager was not told that the proxy is ready", "err", err)
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
	a.eventLog.Info("shutting down: finishing the queries in flight") // queued: a stalled stderr holds no shutdown
	if err := notifyServiceManager(notifySocket, "STOPPING=1\nSTATUS=finishing the queries in flight"); err != nil {
		a.eventLog.Warn("NOTIFY_SOCKET: the service manager was not told that the proxy is stopping", "err", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.UpstreamTimeout+time.Second)
	defer cancel()
	err = a.shutdown(sctx)
	// The event queue is closed: the last lines go to stderr directly, and
	// a stalled stderr gets finalLogWait of them before the process exits
	// without them (TestAttackStalledStderrHoldsTheExit).
	written := make(chan struct{})
	go func() {
		defer close(written)
		if err != nil {
			log.Warn("shutdown cut short", "err", err)
		}
		log.Info("stopped")
	}()
	select {
	case <-written:
	case <-time.After(finalLogWait):
	}
	return 0
}

// finalLogWait bounds the writing of run's last lines to stderr.
const finalLogWait = time.Second

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

// app is one running proxy: its gates, upstreams, DNS server and metrics.
type app struct {
	cfg         Config
	log         *slog.Logger
	metrics     *metrics.Metrics
	proxy       *proxy
	upstreams   *pool.Pool
	events      *asyncLog    // the upstreams' log lines, written off their goroutines
	eventLog    *slog.Logger // the logger that queues them; also the signal loop's
	server      *dnsserver.Server
	metricsLn   net.Listener
	metricsHTTP *http.Server
	listening   atomic.Bool // the DNS server is bound: /readyz
	draining    atomic.Bool // shutdown has begun: /readyz says 503
}

// newApp builds the proxy from cfg, reading time from clock.
func newApp(cfg Config, clock guard.Clock, log *slog.Logger) (*app, error) {
	m := metrics.New()
	v := readBuildVersion()
	m.BuildInfo(v.Version, v.Revision, v.GoVersion)
	m.InFlightLimit(cfg.MaxInflight)
	if cfg.BreakerThreshold > 0 {
		m.EnableBreaker() // with the breakers off, no series may read "closed"
	}
	// The upstreams' readers hold the server's UDP writers while they hand
	// out a batch of replies: the answers leave in one system call a socket.
	// The server's readers hold the upstreams' UDP writers while they serve
	// a batch of queries: the queries forwarded leave together.
	replies, queries := new(batchio.Group), new(batchio.Group)
	// The upstreams log from their readers and sweepers, which must never
	// wait for stderr (asynclog.go).
	events, eventLog := newAsyncLog(log)
	ups, err := newUpstreams(cfg, clock, m, eventLog, replies, queries)
	if err != nil {
		events.Close()
		return nil, err
	}
	qlog, err := openQueryLog(cfg.QueryLog, cfg.QueryLogSample, os.Stderr, log)
	if err != nil {
		ups.Close()
		events.Close()
		return nil, err
	}
	if qlog != nil {
		m.WatchQueryLog(qlog.stats)
	}
	access, denied, clients := initAccess(cfg, clock)
	m.WatchClients(clientStats(clients))
	answers, err := newAnswerCache(cfg, clock, m)
	if err != nil {
		ups.Close()
		events.Close()
		return nil, err
	}
	p := &proxy{access: access, denied: denied, clients: clients, limiter: initLimiter(cfg, clock),
		action: cfg.LimitAction, maxInflight: int64(cfg.MaxInflight), maxUDPSize: cfg.MaxUDPSize,
		followerCap: followerBound(cfg.MaxInflight),
		upstreams:   ups, metrics: m, qlog: qlog, upstreamFor: cfg.Upstream, cache: answers}
	if _, real := clock.(guard.RealClock); !real {
		p.clock = clock
	}
	a := &app{cfg: cfg, log: log, metrics: m, proxy: p, upstreams: ups, events: events, eventLog: eventLog}
	a.server = &dnsserver.Server{
		Addr:           cfg.Listen,
		Handler:        dnsserver.HandlerFunc(p.handleQuery),
		MaxUnanswered:  maxUnanswered(cfg.MaxInflight),
		MaxTCPConns:    cfg.TCPMaxConns,
		TCPIdleTimeout: cfg.TCPIdleTimeout,
		OnDropped:      func(reason string) { m.Dropped.WithLabelValues(reason).Inc() },
		Overloaded:     dnsserver.HandlerFunc(p.refuseUnanswered),
		Writers:        replies,
		Forwards:       queries,
	}
	counts := internalCounts{logs: []*asyncLog{events}, hedges: ups, server: a.server}
	if qlog != nil {
		counts.logs = append(counts.logs, qlog.events)
	}
	m.WatchInternals(counts.read)
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

// initLimiter builds the entry gate the configuration asks for; nil means off.
// The breakers, one per upstream, are built with the upstreams (upstreams.go).
func initLimiter(cfg Config, clock guard.Clock) *guard.TokenBucket {
	if !cfg.RateLimit.On() {
		return nil
	}
	return guard.NewTokenBucket(cfg.RateLimit.Rate, cfg.RateLimit.Burst, clock)
}

// start binds the metrics listener (/metrics, /healthz, /readyz) and the
// DNS server.
func (a *app) start() error {
	if a.cfg.MetricsAddr != "off" {
		ln, err := net.Listen("tcp", a.cfg.MetricsAddr)
		if err != nil {
			a.closeOutputs()
			return fmt.Errorf("DNS_METRICS_ADDR=%q: %v", a.cfg.MetricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", a.metrics.Handler())
		mux.HandleFunc("/healthz", a.handleHealthz)
		mux.HandleFunc("/readyz", a.handleReadyz)
		mux.Handle(flushPath, a.flushHandler()) // admin.go
		a.metricsLn = ln
		a.metricsHTTP = serveMetrics(ln, mux) // metricsconns.go
	}
	if err := a.server.Start(); err != nil {
		a.closeOutputs()
		if a.metricsHTTP != nil {
			a.metricsHTTP.Close()
		}
		return fmt.Errorf("DNS_LISTEN=%q: %v", a.cfg.Listen, err)
	}
	a.listening.Store(true)
	return nil
}

// reopen is what SIGHUP asks for: the query log's file reopened after a log
// rotation. Nothing else is reloaded.
func (a *app) reopen() {
	// Through the queue: the signal loop must never wait for a stalled
	// stderr, or it would not hear SIGTERM.
	if a.proxy.qlog == nil || a.proxy.qlog.path == "" {
		a.eventLog.Info("SIGHUP: nothing to reopen or reload; still serving")
		return
	}
	a.eventLog.Info("SIGHUP: reopening the query log", "path", a.proxy.qlog.path)
	a.proxy.qlog.reopen()
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
	a.draining.Store(true)
	err := a.server.Shutdown(ctx)
	if a.metricsHTTP != nil {
		if herr := a.metricsHTTP.Shutdown(ctx); herr != nil && !errors.Is(herr, http.ErrServerClosed) {
			err = errors.Join(err, herr)
		}
	}
	a.closeOutputs()
	return err
}

// closeOutputs closes the upstream sockets and writes out the query log.
// The log's writer gets queryLogStopWait of its own, whatever the drain
// before it used of the shutdown's deadline: a healthy disk takes
// milliseconds for what the buffer holds, and a writer stuck on its disk
// is given up after that, its lines lost, so the process still stops.
func (a *app) closeOutputs() {
	a.upstreams.Close()
	a.events.Close()
	if a.proxy.qlog != nil {
		ctx, cancel := context.WithTimeout(context.Background(), queryLogStopWait)
		defer cancel()
		a.proxy.qlog.close(ctx)
	}
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
