package fleet

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// TestRedactURL: the password never survives, whether the text parses or not.
func TestRedactURL(t *testing.T) {
	cases := []struct{ in, want string }{
		{"redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"},
		{"redis://:hunter2@127.0.0.1:6379/0", "redis://:xxxxx@127.0.0.1:6379/0"},
		{"rediss://user:hunter2@host/1", "rediss://user:xxxxx@host/1"},
		{"redis://hunter2@host", "redis://xxxxx@host"},
		{"redis://u:hun@ter2@host:1/0", "redis://u:xxxxx@host:1/0"},
		{"redis://u:hunter2@[::1/0", "redis://u:xxxxx@[::1/0"},
		{"u:hunter2@host:6379", "u:xxxxx@host:6379"},
		// "host/path" may be a password alone holding '/': the text up to
		// the last '@' is hidden (no URL New accepts has an '@' after its host).
		{"redis://host/path@x", "redis://xxxxx@x"},
		{"redis://u:pa/ss@host/0", "redis://u:xxxxx@host/0"},
		{"redis://:a#b?c/d@host:1", "redis://:xxxxx@host:1"},
		{"redis://u:p@ss/w?rd@host/0", "redis://u:xxxxx@host/0"},
		{"", ""},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			if got := RedactURL(c.in); got != c.want {
				t.Errorf("RedactURL(%q) = %q, want %q", c.in, got, c.want)
			}
		})
	}
}

// TestNewRejects: bad configuration is an error naming what is wrong, with
// the sentinel to test for, and never the password.
func TestNewRejects(t *testing.T) {
	const secret = "hunter2"
	good := Config{URL: "redis://127.0.0.1:1/0", Rate: 100}
	with := func(f func(*Config)) Config { c := good; f(&c); return c }
	cases := []struct {
		name    string
		cfg     Config
		is      error
		mention string
	}{
		{"empty URL", with(func(c *Config) { c.URL = "" }), ErrURL, "empty"},
		{"unparsable", with(func(c *Config) { c.URL = "redis://u:" + secret + "@[::1/0" }), ErrURL, "does not parse"},
		{"control byte", with(func(c *Config) { c.URL = "redis://:" + secret + "@host\x7f/0" }), ErrURL, "does not parse"},
		{"unknown scheme", with(func(c *Config) { c.URL = "http://u:" + secret + "@127.0.0.1:6379/0" }), ErrURL, `unknown scheme "http"`},
		{"unix socket", with(func(c *Config) { c.URL = "unix://:" + secret + "@/tmp/redis.sock" }), ErrURL, `unknown scheme "unix"`},
		{"no scheme", with(func(c *Config) { c.URL = "127.0.0.1:6379" }), ErrURL, "scheme"},
		{"no host", with(func(c *Config) { c.URL = "redis://:" + secret + "@/0" }), ErrURL, "no host"},
		{"query", with(func(c *Config) { c.URL = "redis://:" + secret + "@h:1/0?read_timeout=" + secret }), ErrURL, "no query"},
		{"bad db", with(func(c *Config) { c.URL = "redis://:" + secret + "@h:1/" + secret }), ErrURL, "database number"},
		{"key with braces", with(func(c *Config) { c.Key = "a{b}" }), ErrConfig, "braces"},
		{"rate 0", with(func(c *Config) { c.Rate = 0 }), ErrConfig, "rate"},
		{"rate NaN", with(func(c *Config) { c.Rate = math.NaN() }), ErrConfig, "rate"},
		{"rate Inf", with(func(c *Config) { c.Rate = math.Inf(1) }), ErrConfig, "rate"},
		{"burst negative", with(func(c *Config) { c.Burst = -1 }), ErrConfig, "burst"},
		{"timeout negative", with(func(c *Config) { c.Timeout = -time.Millisecond }), ErrConfig, "timeout"},
		{"fallback above rate", with(func(c *Config) { c.Fallback = 101 }), ErrConfig, "fallback"},
		{"fallback NaN", with(func(c *Config) { c.Fallback = math.NaN() }), ErrConfig, "fallback"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := New(c.cfg)
			if err == nil {
				l.Close()
				t.Fatalf("New accepted %+v", c.cfg)
			}
			if !errors.Is(err, c.is) {
				t.Errorf("error %q does not wrap %v", err, c.is)
			}
			if !strings.Contains(err.Error(), c.mention) {
				t.Errorf("error %q does not say %q", err, c.mention)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error %q shows the password", err)
			}
			if strings.Contains(c.cfg.URL, secret) && strings.Contains(c.cfg.URL, "@") && !strings.Contains(err.Error(), redactedPassword) {
				t.Errorf("error %q does not show the URL redacted", err)
			}
		})
	}
}

// TestCheckURL: what New refuses, CheckURL refuses first, as a *URLError
// whose URL and reason a caller can print apart, the password left out.
func TestCheckURL(t *testing.T) {
	const secret = "hunter2"
	cases := []struct{ url, reason string }{
		{"redis://127.0.0.1:6379/0", ""},
		{"rediss://u:" + secret + "@host:6380/2", ""},
		{"http://u:" + secret + "@127.0.0.1:6379/0", `unknown scheme "http"`},
		{"redis://u:" + secret + "@[::1/0", "does not parse"},
		{"redis://:" + secret + "@h:1/" + secret, "database number"},
	}
	for _, c := range cases {
		t.Run(c.url, func(t *testing.T) {
			err := CheckURL(c.url)
			if c.reason == "" {
				if err != nil {
					t.Fatalf("CheckURL refused a good URL: %v", err)
				}
				return
			}
			var ue *URLError
			if !errors.As(err, &ue) || !errors.Is(err, ErrURL) {
				t.Fatalf("CheckURL: %v, want a *URLError wrapping ErrURL", err)
			}
			if !strings.Contains(ue.Reason, c.reason) || strings.Contains(ue.Reason+ue.URL+err.Error(), secret) {
				t.Errorf("URL %q, reason %q: want %q and no password", ue.URL, ue.Reason, c.reason)
			}
		})
	}
}
