package main

import (
	"context"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
)

// One rule for every address variable: host:port, the host an IP address,
// localhost or a name; listening may take port 0, the upstream may not; the
// metrics listener may not take the DNS listener's TCP port; the upstream
// may not be the proxy itself.
func TestConfigAddresses(t *testing.T) {
	good := []struct {
		env   map[string]string
		check func(Config) bool
	}{
		{map[string]string{"DNS_LISTEN": "localhost:5398"}, func(c Config) bool { return c.Listen == "127.0.0.1:5398" }},
		{map[string]string{"DNS_METRICS_ADDR": "localhost:9398"}, func(c Config) bool { return c.MetricsAddr == "127.0.0.1:9398" }},
		{map[string]string{"DNS_UPSTREAM": "localhost:53"}, func(c Config) bool { return c.Upstream == "127.0.0.1:53" }},
		{map[string]string{"DNS_UPSTREAM": "LocalHost.:53"}, func(c Config) bool { return c.Upstream == "127.0.0.1:53" }},
		{map[string]string{"DNS_LISTEN": "127.0.0.1:0", "DNS_METRICS_ADDR": "127.0.0.1:0"}, func(c Config) bool {
			return c.Listen == "127.0.0.1:0" && c.MetricsAddr == "127.0.0.1:0"
		}},
		{map[string]string{"DNS_LISTEN": "127.0.0.1:5398", "DNS_METRICS_ADDR": "127.0.0.2:5398"}, func(c Config) bool { return c.MetricsAddr == "127.0.0.2:5398" }},
		{map[string]string{"DNS_LISTEN": "[::1]:5398", "DNS_METRICS_ADDR": "127.0.0.1:5398"}, func(c Config) bool { return c.Listen == "[::1]:5398" }},
	}
	for _, tt := range good {
		t.Run(envString(tt.env), func(t *testing.T) {
			setEnv(t, withUpstream(tt.env))
			cfg, err := loadConfig()
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(cfg) {
				t.Fatalf("parsed as %+v", cfg)
			}
		})
	}
	bad := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"DNS_UPSTREAM": "127.0.0.1:0"}, `DNS_UPSTREAM="127.0.0.1:0": must be host:port such as 127.0.0.1:53, port 1..65535`},
		{map[string]string{"DNS_UPSTREAM": "a..b:53"}, `DNS_UPSTREAM="a..b:53": must be host:port such as 127.0.0.1:53, port 1..65535`},
		{map[string]string{"DNS_UPSTREAM": ":53"}, `DNS_UPSTREAM=":53": must be host:port such as 127.0.0.1:53, port 1..65535`},
		{map[string]string{"DNS_UPSTREAM": "127.0.0.1:domain"}, `DNS_UPSTREAM="127.0.0.1:domain": must be host:port such as 127.0.0.1:53, port 1..65535`},
		{map[string]string{"DNS_LISTEN": "127.0.0.1:65536"}, `DNS_LISTEN="127.0.0.1:65536": must be host:port such as 127.0.0.1:5398, port 0..65535 (0: any free port)`},
		{map[string]string{"DNS_LISTEN": "bad name:53"}, `DNS_LISTEN="bad name:53": must be host:port such as 127.0.0.1:5398, port 0..65535 (0: any free port)`},
		{map[string]string{"DNS_METRICS_ADDR": "9398"}, `DNS_METRICS_ADDR="9398": must be host:port such as 127.0.0.1:9398, port 0..65535 (0: any free port), or off`},
		{map[string]string{"DNS_METRICS_ADDR": "127.0.0.1:5398"}, `DNS_METRICS_ADDR="127.0.0.1:5398": must differ from DNS_LISTEN (127.0.0.1:5398): both take TCP port 5398`},
		{map[string]string{"DNS_METRICS_ADDR": "localhost:5398"}, `DNS_METRICS_ADDR="localhost:5398": must differ from DNS_LISTEN (127.0.0.1:5398): both take TCP port 5398`},
		{map[string]string{"DNS_METRICS_ADDR": "0.0.0.0:5398"}, `DNS_METRICS_ADDR="0.0.0.0:5398": must differ from DNS_LISTEN (127.0.0.1:5398): both take TCP port 5398`},
		{map[string]string{"DNS_LISTEN": "[::]:53", "DNS_METRICS_ADDR": "127.0.0.1:53"}, `DNS_METRICS_ADDR="127.0.0.1:53": must differ from DNS_LISTEN ([::]:53): both take TCP port 53`},
		{map[string]string{"DNS_UPSTREAM": "127.0.0.1:5398"}, `DNS_UPSTREAM="127.0.0.1:5398": must not be DNS_LISTEN (127.0.0.1:5398): every query would come back to dnsproxi`},
		{map[string]string{"DNS_UPSTREAM": "127.0.0.1:53", "DNS_LISTEN": "0.0.0.0:53"}, `DNS_UPSTREAM="127.0.0.1:53": must not be DNS_LISTEN (0.0.0.0:53): every query would come back to dnsproxi`},
	}
	for _, tt := range bad {
		t.Run(envString(tt.env), func(t *testing.T) { wantConfigError(t, tt.env, tt.want) })
	}
}

// fakeResolver answers from names; every other name does not exist. It
// records each lookup, and a lookup of an IP literal or of localhost, which
// need no resolver, fails the test.
type fakeResolver struct {
	t       testing.TB
	names   map[string][]netip.Addr
	lookups []string
}

func (r *fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.lookups = append(r.lookups, host)
	if _, err := netip.ParseAddr(host); err == nil || strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		r.t.Errorf("looked up %q, which needs no resolver", host)
	}
	if ips, ok := r.names[host]; ok {
		return ips, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// A host name is resolved at configuration time, once, and the proxy gets
// the address; a name that does not resolve is a configuration error that
// names its variable. IP literals and localhost are never looked up.
func TestConfigResolvesNamesOnce(t *testing.T) {
	names := map[string][]netip.Addr{
		"dns.example":   {netip.MustParseAddr("2001:db8::53"), netip.MustParseAddr("192.0.2.53")},
		"v6.example":    {netip.MustParseAddr("2001:db8::1")},
		"proxy.example": {netip.MustParseAddr("192.0.2.1")},
		"empty.example": {},
	}
	good := []struct {
		env     map[string]string
		check   func(Config) bool
		lookups []string
	}{
		{map[string]string{"DNS_UPSTREAM": "dns.example:53"}, func(c Config) bool { return c.Upstream == "192.0.2.53:53" }, []string{"dns.example"}},
		{map[string]string{"DNS_UPSTREAM": "v6.example:53"}, func(c Config) bool { return c.Upstream == "[2001:db8::1]:53" }, []string{"v6.example"}},
		{map[string]string{"DNS_LISTEN": "proxy.example:53", "DNS_METRICS_ADDR": "proxy.example:9398"}, func(c Config) bool {
			return c.Listen == "192.0.2.1:53" && c.MetricsAddr == "192.0.2.1:9398"
		}, []string{"proxy.example", "proxy.example"}},
		{map[string]string{"DNS_UPSTREAM": "127.0.0.1:53", "DNS_LISTEN": "localhost:5353", "DNS_METRICS_ADDR": "[::1]:9398"}, func(c Config) bool {
			return c.Upstream == "127.0.0.1:53" && c.Listen == "127.0.0.1:5353" && c.MetricsAddr == "[::1]:9398"
		}, nil},
	}
	for _, tt := range good {
		t.Run(envString(tt.env), func(t *testing.T) {
			setEnv(t, withUpstream(tt.env))
			r := &fakeResolver{t: t, names: names}
			cfg, err := readConfig(os.LookupEnv, r)
			if err != nil {
				t.Fatal(err)
			}
			if !tt.check(cfg) {
				t.Fatalf("parsed as %+v", cfg)
			}
			if !slices.Equal(r.lookups, tt.lookups) {
				t.Fatalf("looked up %q, want %q", r.lookups, tt.lookups)
			}
		})
	}
	bad := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"DNS_UPSTREAM": "nowhere.example:53"}, `DNS_UPSTREAM="nowhere.example:53": must name a host that resolves (lookup nowhere.example: no such host)`},
		{map[string]string{"DNS_UPSTREAM": "empty.example:53"}, `DNS_UPSTREAM="empty.example:53": must name a host that resolves (empty.example has no address)`},
		{map[string]string{"DNS_LISTEN": "nowhere.example:53"}, `DNS_LISTEN="nowhere.example:53": must name a host that resolves (lookup nowhere.example: no such host)`},
		{map[string]string{"DNS_METRICS_ADDR": "nowhere.example:9398"}, `DNS_METRICS_ADDR="nowhere.example:9398": must name a host that resolves (lookup nowhere.example: no such host)`},
		{map[string]string{"DNS_METRICS_ADDR": "proxy.example:53", "DNS_LISTEN": "192.0.2.1:53"}, `DNS_METRICS_ADDR="proxy.example:53": must differ from DNS_LISTEN (192.0.2.1:53): both take TCP port 53`},
	}
	for _, tt := range bad {
		t.Run(envString(tt.env), func(t *testing.T) {
			setEnv(t, withUpstream(tt.env))
			_, err := readConfig(os.LookupEnv, &fakeResolver{t: t, names: names})
			if err == nil || err.Error() != tt.want {
				t.Fatalf("error %v\nwant  %s", err, tt.want)
			}
		})
	}
}
