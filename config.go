package main

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/miekg/dns"
)

// Config is dnsproxi's configuration, read from DNS_* environment variables.
type Config struct {
	Listen            string        `envconfig:"LISTEN" default:"127.0.0.1:5398" desc:"UDP and TCP listen address"`
	Upstream          string        `envconfig:"UPSTREAM" desc:"upstream host:port (default: first nameserver of /etc/resolv.conf, port 53)"`
	UpstreamTimeout   time.Duration `envconfig:"UPSTREAM_TIMEOUT" default:"2s" desc:"deadline of one upstream exchange"`
	RateLimit         RateLimit     `envconfig:"RATE_LIMIT" desc:"entry gate: rate or rate,burst in queries per second (burst defaults to rate); empty = off"`
	BreakerThreshold  int           `envconfig:"BREAKER_THRESHOLD" default:"0" desc:"forward gate: failure percentage 1..100 that trips the breaker; 0 = off"`
	BreakerMinSamples int           `envconfig:"BREAKER_MIN_SAMPLES" default:"20" desc:"no trip below this many outcomes in the window"`
	BreakerWindow     int           `envconfig:"BREAKER_WINDOW" default:"100" desc:"the breaker judges the last N outcomes"`
	BreakerCoolOff    time.Duration `envconfig:"BREAKER_COOLOFF" default:"5s" desc:"open to half-open after this long; must exceed DNS_UPSTREAM_TIMEOUT"`
	MetricsAddr       string        `envconfig:"METRICS_ADDR" default:"127.0.0.1:9398" desc:"/metrics listen address; off disables it"`
	MaxInflight       int           `envconfig:"MAX_INFLIGHT" default:"1000" desc:"upstream exchanges in flight at once; beyond it REFUSED at once; 0 = unlimited"`
	TCPMaxConns       int           `envconfig:"TCP_MAX_CONNS" default:"1000" desc:"client TCP connections open at once; beyond it a new one is closed"`
	TCPIdleTimeout    time.Duration `envconfig:"TCP_IDLE_TIMEOUT" default:"10s" desc:"a client TCP connection that delivers no whole query for this long is closed"`
}

// RateLimit is DNS_RATE_LIMIT: "rate" or "rate,burst". The zero value is off.
type RateLimit struct {
	Rate  float64
	Burst int
}

// On reports whether the entry gate is configured.
func (r RateLimit) On() bool { return r.Rate > 0 }

// Decode parses "rate" or "rate,burst" for envconfig.
func (r *RateLimit) Decode(s string) error {
	s = strings.TrimSpace(s)
	if s == "" {
		*r = RateLimit{}
		return nil
	}
	rateText, burstText, hasBurst := strings.Cut(s, ",")
	rate, err := strconv.ParseFloat(strings.TrimSpace(rateText), 64)
	if err != nil || !(rate > 0) || math.IsInf(rate, 0) {
		return errors.New("rate must be a positive number of queries per second")
	}
	burst := int(math.Ceil(rate))
	if hasBurst {
		burst, err = strconv.Atoi(strings.TrimSpace(burstText))
		if err != nil || burst < 1 {
			return errors.New("burst must be a positive integer")
		}
	} else if rate > math.MaxInt32 {
		burst = math.MaxInt32
	}
	*r = RateLimit{Rate: rate, Burst: burst}
	return nil
}

// String formats the value as it is written in DNS_RATE_LIMIT.
func (r RateLimit) String() string {
	if !r.On() {
		return "off"
	}
	return strconv.FormatFloat(r.Rate, 'f', -1, 64) + "," + strconv.Itoa(r.Burst)
}

// loadConfig reads and validates the environment. Its error is one line that
// names the variable, the value and what is expected.
func loadConfig() (Config, error) {
	var cfg Config
	if err := envconfig.Process("dns", &cfg); err != nil {
		var pe *envconfig.ParseError
		if errors.As(err, &pe) {
			return cfg, fmt.Errorf("%s=%q: %s", pe.KeyName, pe.Value, expectation(pe))
		}
		return cfg, err
	}
	if cfg.Upstream == "" {
		up, err := systemResolver("/etc/resolv.conf")
		if err != nil {
			return cfg, fmt.Errorf("DNS_UPSTREAM is not set and %v", err)
		}
		cfg.Upstream = up
	}
	return cfg, cfg.validate()
}

// expectation says what a variable that failed to parse should hold.
func expectation(pe *envconfig.ParseError) string {
	switch pe.TypeName {
	case "time.Duration":
		return "must be a duration such as 2s or 500ms"
	case "int":
		return "must be an integer"
	}
	return pe.Err.Error() // our own types say it themselves
}

func (c Config) validate() error {
	bad := func(key string, value any, want string) error {
		return fmt.Errorf("DNS_%s=%q: %s", key, fmt.Sprint(value), want)
	}
	if _, err := netip.ParseAddrPort(c.Listen); err != nil {
		return bad("LISTEN", c.Listen, "must be an IP address and port such as 127.0.0.1:5398")
	}
	if err := checkHostPort(c.Upstream); err != nil {
		return bad("UPSTREAM", c.Upstream, "must be host:port such as 127.0.0.1:53")
	}
	if c.UpstreamTimeout <= 0 {
		return bad("UPSTREAM_TIMEOUT", c.UpstreamTimeout, "must be a positive duration")
	}
	if c.BreakerThreshold < 0 || c.BreakerThreshold > 100 {
		return bad("BREAKER_THRESHOLD", c.BreakerThreshold, "must be a percentage 1..100, or 0 for off")
	}
	if c.BreakerWindow < 1 {
		return bad("BREAKER_WINDOW", c.BreakerWindow, "must be a positive integer")
	}
	if c.BreakerMinSamples < 1 || c.BreakerMinSamples > c.BreakerWindow {
		return bad("BREAKER_MIN_SAMPLES", c.BreakerMinSamples, fmt.Sprintf("must be 1..%d (DNS_BREAKER_WINDOW)", c.BreakerWindow))
	}
	if c.BreakerCoolOff <= c.UpstreamTimeout {
		return bad("BREAKER_COOLOFF", c.BreakerCoolOff, fmt.Sprintf("must exceed DNS_UPSTREAM_TIMEOUT (%v)", c.UpstreamTimeout))
	}
	if c.MaxInflight < 0 {
		return bad("MAX_INFLIGHT", c.MaxInflight, "must be 0 (unlimited) or a positive integer")
	}
	if c.TCPMaxConns < 1 {
		return bad("TCP_MAX_CONNS", c.TCPMaxConns, "must be a positive integer")
	}
	if c.TCPIdleTimeout <= 0 {
		return bad("TCP_IDLE_TIMEOUT", c.TCPIdleTimeout, "must be a positive duration")
	}
	if c.MetricsAddr != "off" && checkHostPort(c.MetricsAddr) != nil {
		return bad("METRICS_ADDR", c.MetricsAddr, "must be host:port such as 127.0.0.1:9398, or off")
	}
	return nil
}

func checkHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return err
	}
	if host == "" {
		return errors.New("no host")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return errors.New("bad port")
	}
	return nil
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

// usage is what dnsproxi -h prints.
func usage() string {
	var b strings.Builder
	b.WriteString("dnsproxi: a DNS forwarding proxy with a rate limit and a circuit breaker.\n\n")
	b.WriteString("Usage: dnsproxi   (configured only through the environment)\n\n")
	b.WriteString("Variables:\n")
	tw := tabwriter.NewWriter(&b, 1, 0, 3, ' ', 0)
	_ = envconfig.Usagef("dns", &Config{}, tw, "{{range .}}  {{usage_key .}}\t{{usage_default .}}\t{{usage_description .}}\n{{end}}")
	tw.Flush()
	return b.String()
}
