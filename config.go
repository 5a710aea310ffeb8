package main

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/miekg/dns"
)

// Config is dnsproxi's configuration, read from DNS_* environment variables
// by loadConfig. Each field's tags name its variable (envconfig), its
// default, what -h says of it (desc) and, for numbers and durations, the
// range it must lie in (min, max).
type Config struct {
	// Set by fitDescriptors when it lowered the default DNS_TCP_MAX_CONNS
	// (from tcpConnsLowered) to fit the descriptor limit.
	tcpConnsLowered int
	descriptors     uint64
	reserved        uint64 // the descriptors kept for everything else

	Listen            string         `envconfig:"LISTEN" default:"127.0.0.1:5398" desc:"UDP and TCP listen address; port 0 takes a free port"`
	Upstream          string         `envconfig:"UPSTREAM" desc:"upstream resolvers: host:port, port 1..65535, or a comma-separated list of 1 to 16; unset: the first nameserver of /etc/resolv.conf, port 53"`
	UpstreamTimeout   time.Duration  `envconfig:"UPSTREAM_TIMEOUT" default:"2s" min:"10ms" max:"30s" desc:"deadline of one query upstream, TCP retry, retries and hedges included"`
	UpstreamPolicy    UpstreamPolicy `envconfig:"UPSTREAM_POLICY" default:"sequential" desc:"which upstream a query goes to, among those whose breaker admits: sequential (the first listed), round_robin or fastest"`
	RetryBudget       int            `envconfig:"RETRY_BUDGET" default:"10" min:"0" max:"100" desc:"retries and hedges, in percent of queries over 10s (at least 3 a second); 0 = never"`
	UpstreamHedge     Hedge          `envconfig:"UPSTREAM_HEDGE" desc:"a query unanswered this long also goes to the next upstream: 1ms..30s, at most 9/10 of DNS_UPSTREAM_TIMEOUT, or off; unset: a quarter of DNS_UPSTREAM_TIMEOUT with several upstreams"`
	RateLimit         RateLimit      `envconfig:"RATE_LIMIT" default:"off" desc:"entry gate: rate or rate,burst in queries per second, rate 0.001..100000000, burst 1..100000000 (without one: the rate rounded up); off"`
	BreakerThreshold  int            `envconfig:"BREAKER_THRESHOLD" default:"0" min:"0" max:"100" desc:"forward gate: failure percentage that trips the breaker; 0 = off"`
	BreakerMinSamples int            `envconfig:"BREAKER_MIN_SAMPLES" default:"20" min:"1" max:"100000" desc:"no trip below this many outcomes in the window; at most DNS_BREAKER_WINDOW (unset: 20, or the window if smaller)"`
	BreakerWindow     int            `envconfig:"BREAKER_WINDOW" default:"100" min:"1" max:"100000" desc:"the breaker judges the last N outcomes"`
	BreakerCoolOff    time.Duration  `envconfig:"BREAKER_COOLOFF" default:"5s" min:"10ms" max:"1h" desc:"open to half-open after this long; must exceed DNS_UPSTREAM_TIMEOUT while the breaker is on"`
	MetricsAddr       string         `envconfig:"METRICS_ADDR" default:"127.0.0.1:9398" desc:"/metrics listen address, never DNS_LISTEN's TCP port; port 0 takes a free port; off disables it"`
	MaxInflight       int            `envconfig:"MAX_INFLIGHT" default:"1000" min:"0" max:"100000" desc:"upstream exchanges in flight at once; beyond it REFUSED at once; 0 = unlimited"`
	TCPMaxConns       int            `envconfig:"TCP_MAX_CONNS" default:"1000" min:"1" max:"100000" desc:"client TCP connections open at once; when all are taken a new one replaces the idlest of the 64 oldest with no query unanswered, or is closed if each has one"`
	TCPIdleTimeout    time.Duration  `envconfig:"TCP_IDLE_TIMEOUT" default:"10s" min:"1s" max:"1h" desc:"a client TCP connection that delivers no whole query for this long is closed"`
	MaxUDPSize        int            `envconfig:"MAX_UDP_SIZE" default:"1232" min:"512" max:"4096" desc:"largest UDP answer, and the UDP size advertised upstream (1232: DNS Flag Day 2020)"`
	Upstream0x20      bool           `envconfig:"UPSTREAM_0X20" default:"on" desc:"randomise the letter case of the query name sent upstream (0x20, RFC 5452); on or off"`
	Allow             AccessRule     `envconfig:"ALLOW" default:"local" desc:"clients that may query, comma-separated CIDRs or addresses; local = loopback, RFC 1918, RFC 6598, IPv6 ULA and link-local; any = every address (an open resolver); others get REFUSED"`
	ClientRateLimit   RateLimit      `envconfig:"CLIENT_RATE_LIMIT" default:"off" desc:"per-client gate, before DNS_RATE_LIMIT, a table for UDP and one for TCP: rate or rate,burst per client prefix, as DNS_RATE_LIMIT; off"`
	ClientPrefix      ClientPrefix   `envconfig:"CLIENT_PREFIX" default:"32,64" desc:"v4len,v6len: the leading bits of an address that name one client of the per-client gate, 0..32 and 0..128"`
	ClientTableSize   int            `envconfig:"CLIENT_TABLE_SIZE" default:"100000" min:"8" max:"10000000" desc:"client prefixes the per-client gate holds (used in groups of 8); beyond it new prefixes share one bucket"`
	ClientExempt      PrefixList     `envconfig:"CLIENT_EXEMPT" desc:"clients that skip the per-client gate (not DNS_RATE_LIMIT), comma-separated CIDRs or addresses; unset: none"`
	QueryLog          QueryLogTarget `envconfig:"QUERY_LOG" default:"off" desc:"one JSON line per query (time, client, name, type, outcome, rcode, upstream, duration): off, stderr, or an absolute file path, appended to and reopened on SIGHUP"`
	QueryLogSample    Sample         `envconfig:"QUERY_LOG_SAMPLE" default:"1" desc:"share of queries the query log keeps, above 0 and at most 1 (0.01: one in a hundred)"`
	LimitAction       LimitAction    `envconfig:"LIMIT_ACTION" default:"drop" desc:"what a UDP query beyond DNS_CLIENT_RATE_LIMIT or DNS_RATE_LIMIT gets: drop, refuse (REFUSED) or slip[:N] (every Nth, default 2, an empty TC answer, the rest dropped), N 1..10; over TCP always REFUSED"`

	// The answer cache (cacheconfig.go checks the rules that tie them together).
	CacheSize           ByteSize      `envconfig:"CACHE_SIZE" default:"off" desc:"answer cache: the bytes it may hold, a whole number with a unit B, KB, MB or GB (powers of 1024; none: bytes), such as 64MB, from 256KB to 64GB; 0 or off = no cache"`
	CacheMinTTL         time.Duration `envconfig:"CACHE_MIN_TTL" default:"0s" min:"0s" max:"1h" desc:"cache: a shorter TTL is raised to this (whole seconds); a TTL of 0 is never stored"`
	CacheMaxTTL         time.Duration `envconfig:"CACHE_MAX_TTL" default:"24h" min:"1s" max:"168h" desc:"cache: a longer TTL of a positive answer is lowered to this (whole seconds)"`
	CacheMaxNegativeTTL time.Duration `envconfig:"CACHE_MAX_NEGATIVE_TTL" default:"1h" min:"1s" max:"24h" desc:"cache: a longer TTL of NXDOMAIN or NODATA (RFC 2308: min of the SOA's TTL and MINIMUM) is lowered to this (whole seconds)"`
	CacheStale          time.Duration `envconfig:"CACHE_STALE" default:"0s" min:"0s" max:"168h" desc:"serve-stale (RFC 8767): how long past its expiry a cached answer may still be served, TTL 30, when its refresh fails or no upstream can be asked; 0 = off"`
	CacheStaleWait      time.Duration `envconfig:"CACHE_STALE_WAIT" default:"1.8s" min:"0s" max:"30s" desc:"serve-stale: an expired answer whose refresh has not come back within this is served stale while the refresh goes on; below DNS_UPSTREAM_TIMEOUT; 0 = wait for the refresh"`
	CachePrefetch       bool          `envconfig:"CACHE_PREFETCH" default:"off" desc:"cache: an answer asked for in the last 10% of its TTL is refreshed in the background, once; on or off"`

	// The outbound limit (config_outbound.go), and the fleet's on Redis.
	UpstreamRateLimit         RateLimit     `envconfig:"UPSTREAM_RATE_LIMIT" default:"off" desc:"outbound limit: every attempt sent to any upstream (first, retry, hedge) pays a token; rate or rate,burst as DNS_RATE_LIMIT; beyond it REFUSED (upstream_limited); off"`
	UpstreamRateLimitRedis    RedisURL      `envconfig:"UPSTREAM_RATE_LIMIT_REDIS" desc:"makes DNS_UPSTREAM_RATE_LIMIT the fleet's total, shared on Redis by every dnsproxi naming it and the key: redis://[user:password@]host[:port][/db] or rediss://; needs DNS_UPSTREAM_RATE_LIMIT; unset: off"`
	UpstreamRateLimitKey      string        `envconfig:"UPSTREAM_RATE_LIMIT_KEY" default:"dnsproxi" desc:"the fleet's shared bucket on Redis: instances naming the same Redis and key share one rate; no braces; needs DNS_UPSTREAM_RATE_LIMIT_REDIS"`
	UpstreamRateLimitTimeout  time.Duration `envconfig:"UPSTREAM_RATE_LIMIT_REDIS_TIMEOUT" default:"50ms" min:"1ms" max:"1s" desc:"a Redis call that fails or takes longer switches the instance to its local share (the rate ÷ the instances last seen) until Redis answers again; needs DNS_UPSTREAM_RATE_LIMIT_REDIS"`
	UpstreamRateLimitFallback Fallback      `envconfig:"UPSTREAM_RATE_LIMIT_FALLBACK" desc:"queries per second an instance may send upstream before it has ever reached Redis, 0.001 up to the rate; unset: the whole rate; needs DNS_UPSTREAM_RATE_LIMIT_REDIS"`
}

// Variables whose rules involve another, named in their errors.
const (
	keyListen          = "DNS_LISTEN"
	keyUpstream        = "DNS_UPSTREAM"
	keyUpstreamTimeout = "DNS_UPSTREAM_TIMEOUT"
	keyMinSamples      = "DNS_BREAKER_MIN_SAMPLES"
	keyCoolOff         = "DNS_BREAKER_COOLOFF"
	keyMetricsAddr     = "DNS_METRICS_ADDR"
	keyClientRate      = "DNS_CLIENT_RATE_LIMIT"
	keyTCPMaxConns     = "DNS_TCP_MAX_CONNS"
)

// The entry gate's bounds. Below minRate a drained bucket takes over a
// quarter of an hour to earn one query back; maxRate is more queries per
// second than one machine receives, and maxBurst matches it.
const (
	minRate  = 0.001
	maxRate  = 1e8
	maxBurst = 100_000_000
)

// maxClientRefill is the longest a per-client bucket may take to refill
// (guard's bound).
const maxClientRefill = 100 * 365 * 24 * time.Hour

// resolveTimeout bounds the start-up lookup of a host name.
const resolveTimeout = 10 * time.Second

// RateLimit is DNS_RATE_LIMIT: "rate" or "rate,burst", or "off". The zero
// value is off.
type RateLimit struct {
	Rate  float64
	Burst int
}

// On reports whether the entry gate is configured.
func (r RateLimit) On() bool { return r.Rate > 0 }

// What DNS_RATE_LIMIT's two parts expect.
var (
	errRate  = fmt.Errorf("rate must be a number of queries per second from %s to %s, or off", formatRate(minRate), formatRate(maxRate))
	errBurst = fmt.Errorf("burst must be an integer from 1 to %d", maxBurst)
)

// Decode parses "rate", "rate,burst", "off" (any case) or nothing (off).
func (r *RateLimit) Decode(s string) error {
	s = strings.TrimSpace(s)
	if s == "" || strings.EqualFold(s, "off") {
		*r = RateLimit{}
		return nil
	}
	rateText, burstText, hasBurst := strings.Cut(s, ",")
	rate, err := strconv.ParseFloat(strings.TrimSpace(rateText), 64)
	if err != nil || !(rate >= minRate && rate <= maxRate) { // NaN fails both
		return errRate
	}
	burst := int(math.Ceil(rate))
	if hasBurst {
		burst, err = strconv.Atoi(strings.TrimSpace(burstText))
		if err != nil || burst < 1 || burst > maxBurst {
			return errBurst
		}
	}
	*r = RateLimit{Rate: rate, Burst: burst}
	return nil
}

// String formats the value as it is written in DNS_RATE_LIMIT.
func (r RateLimit) String() string {
	if !r.On() {
		return "off"
	}
	return formatRate(r.Rate) + "," + strconv.Itoa(r.Burst)
}

func formatRate(rate float64) string { return strconv.FormatFloat(rate, 'f', -1, 64) }

// resolver looks host names up; *net.Resolver is one.
type resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// loadConfig reads and validates the environment, resolving host names
// through the system once. Its error is one line that names the variable,
// the value and what is expected.
func loadConfig() (Config, error) {
	cfg, err := readConfig(os.LookupEnv, net.DefaultResolver)
	if err != nil {
		return cfg, err
	}
	text, _ := os.LookupEnv(keyTCPMaxConns)
	return cfg, cfg.fitDescriptors(descriptorLimit(), udpListeners(), strings.TrimSpace(text) != "")
}

// readConfig is loadConfig with the environment and the resolver given.
func readConfig(lookup func(string) (string, bool), r resolver) (Config, error) {
	var cfg Config
	given, err := readEnv(&cfg, lookup)
	if err != nil {
		return cfg, err
	}
	if cfg.Upstream == "" {
		up, err := systemResolver("/etc/resolv.conf")
		if err != nil {
			return cfg, fmt.Errorf("%s is not set and %v", keyUpstream, err)
		}
		cfg.Upstream = up
	}
	if err := cfg.settleAddresses(given, r); err != nil {
		return cfg, err
	}
	if err := cfg.checkClientRate(given); err != nil {
		return cfg, err
	}
	if err := cfg.checkFailover(given); err != nil {
		return cfg, err
	}
	if err := cfg.checkCache(given); err != nil {
		return cfg, err
	}
	if err := cfg.checkOutbound(given); err != nil {
		return cfg, err
	}
	return cfg, cfg.checkBreaker(given)
}

// checkClientRate refuses a per-client bucket that would take longer than
// the table allows (guard's 100 years) to refill: the per-client table
// keeps its buckets as a time in nanoseconds.
func (c *Config) checkClientRate(given envText) error {
	r := c.ClientRateLimit
	if r.On() && float64(r.Burst)*math.Ceil(float64(time.Second)/r.Rate) > float64(maxClientRefill) { // as guard computes it
		return fmt.Errorf("%s=%q: a bucket must refill within 100 years: burst/rate is %g s", keyClientRate, given[keyClientRate], float64(r.Burst)/r.Rate)
	}
	return nil
}

// settleAddresses holds every address variable to one rule (see usage) and
// replaces each host name by the address it resolves to, so that nothing
// is looked up after start-up. Two listeners on one TCP port, and an
// upstream that is the proxy itself, are refused here rather than failing
// later.
func (c *Config) settleAddresses(given envText, r resolver) error {
	listen, err := resolveAddr(c.Listen, true, r)
	if err != nil {
		return addrError(keyListen, given.or(keyListen, c.Listen), "host:port such as 127.0.0.1:5398, port 0..65535 (0: any free port)", err)
	}
	if err := c.settleUpstreams(given, listen, r); err != nil {
		return err
	}
	c.Listen = listen.String()
	if strings.EqualFold(c.MetricsAddr, "off") {
		c.MetricsAddr = "off"
		return nil
	}
	metrics, err := resolveAddr(c.MetricsAddr, true, r)
	if err != nil {
		return addrError(keyMetricsAddr, given.or(keyMetricsAddr, c.MetricsAddr), "host:port such as 127.0.0.1:9398, port 0..65535 (0: any free port), or off", err)
	}
	if sharePort(listen, metrics) {
		return fmt.Errorf("%s=%q: must differ from %s (%v): both take TCP port %d", keyMetricsAddr, given.or(keyMetricsAddr, c.MetricsAddr), keyListen, listen, listen.Port())
	}
	c.MetricsAddr = metrics.String()
	return nil
}

// checkBreaker applies the rules that tie the breaker's variables together,
// only when the breaker is on. A rule broken by a default names the
// variable the operator did set.
func (c *Config) checkBreaker(given envText) error {
	if _, ok := given[keyMinSamples]; !ok {
		c.BreakerMinSamples = min(c.BreakerMinSamples, c.BreakerWindow)
	}
	if c.BreakerThreshold == 0 {
		return nil
	}
	if c.BreakerMinSamples > c.BreakerWindow {
		return fmt.Errorf("%s=%q: must not exceed DNS_BREAKER_WINDOW (%d) while the breaker is on", keyMinSamples, given[keyMinSamples], c.BreakerWindow)
	}
	if c.BreakerCoolOff > c.UpstreamTimeout {
		return nil
	}
	_, coolOffSet := given[keyCoolOff]
	if _, timeoutSet := given[keyUpstreamTimeout]; timeoutSet && !coolOffSet {
		return fmt.Errorf("%s=%q: must be shorter than %s (%v, its default) while the breaker is on", keyUpstreamTimeout, given[keyUpstreamTimeout], keyCoolOff, c.BreakerCoolOff)
	}
	return fmt.Errorf("%s=%q: must exceed %s (%v) while the breaker is on", keyCoolOff, given.or(keyCoolOff, c.BreakerCoolOff.String()), keyUpstreamTimeout, c.UpstreamTimeout)
}

// systemResolver returns the first nameserver of resolv.conf, port 53.
func systemResolver(path string) (string, error) {
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return "", fmt.Errorf("reading %s: %v", path, err)
	}
	if len(cc.Servers) == 0 {
		return "", fmt.Errorf("%s names no nameserver", path)
	}
	return net.JoinHostPort(cc.Servers[0], "53"), nil
}

// usageRules is -h's header: how every variable is read.
const usageRules = `Every variable:
  unset, empty or only spaces   its default applies
  spaces around a value         ignored
  keywords                      any case: off, on, true, false, localhost, and duration units (2S = 2s)
  on/off switches               on or off; also true/false, 1/0
  durations                     a number and a unit: 500ms, 2s, 1m
  numbers                       within the range listed
  addresses                     host:port; the host is an IP address, localhost (127.0.0.1, never
                                looked up) or a name, resolved once at start-up (its first address,
                                IPv4 first); listeners may take port 0 (any free port)
  A value out of its rule, or two variables that contradict each other, stop start-up with one
  line naming the variable, the value and what is expected, and exit code 2.
`

// usage is what dnsproxi -h prints.
func usage() string {
	var b strings.Builder
	b.WriteString("dnsproxi: a DNS forwarding proxy with a rate limit and a circuit breaker.\n\n")
	b.WriteString("Usage: dnsproxi            (configured only through the environment)\n")
	b.WriteString("       dnsproxi -version   (the build's version, commit and Go version)\n\n")
	b.WriteString(usageRules)
	b.WriteString("\nVariables:\n")
	tw := tabwriter.NewWriter(&b, 1, 0, 3, ' ', 0)
	_ = envconfig.Usagef("dns", &Config{}, tw, "  VARIABLE\tDEFAULT\tRANGE\tMEANING\n"+
		`{{range .}}  {{usage_key .}}`+"\t"+`{{or (usage_default .) "-"}}`+"\t"+
		`{{if .Tags.Get "max"}}{{.Tags.Get "min"}}..{{.Tags.Get "max"}}{{else}}-{{end}}`+"\t"+
		"{{usage_description .}}\n{{end}}")
	tw.Flush()
	b.WriteString("\nAlso read from the environment:\n")
	b.WriteString("  GOMAXPROCS      unset: the threads running Go code follow the load, one until it is busy, then one a core; set: kept as given\n")
	b.WriteString("  NOTIFY_SOCKET   set by systemd (Type=notify): READY=1 once answering, STOPPING=1 when the drain starts\n")
	return b.String()
}
