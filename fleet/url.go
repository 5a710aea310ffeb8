package fleet

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// redactedPassword stands where a URL's password was.
const redactedPassword = "xxxxx"

// redisTarget is a parsed Redis URL: the client's options, the URL as it may
// be shown, and the secret that must never be.
type redisTarget struct {
	options  *redis.Options
	shown    string
	password string
}

// RedactURL returns raw with the password of its user information replaced
// by "xxxxx", so it can be printed. It works on text that does not parse as
// a URL too: a user information part without a colon is redacted whole,
// since it may be a password alone, and the user information ends at the
// last '@' of the text, not at the first '/', '?' or '#': a password that
// was not percent-encoded may hold those (a base64 one holds '/'). A URL New
// accepts has no '@' after its host (its path is a database number, it has
// no query), so only a URL refused anyway can show less than it might.
func RedactURL(raw string) string {
	rest, authStart := raw, 0
	if i := strings.Index(raw, "://"); i >= 0 {
		authStart = i + 3
		rest = raw[authStart:]
	}
	at := strings.LastIndexByte(rest, '@')
	if at < 0 {
		return raw
	}
	userinfo := rest[:at]
	user, _, hasPassword := strings.Cut(userinfo, ":")
	shown := redactedPassword
	if hasPassword {
		shown = user + ":" + redactedPassword
	}
	return raw[:authStart] + shown + rest[at:]
}

// parseURL reads a redis:// or rediss:// URL into client options. Its errors
// wrap ErrURL and show the URL redacted; the cause is described in our own
// words, since a parser's message may quote the password.
func parseURL(raw string) (redisTarget, error) {
	shown := RedactURL(raw)
	var password string
	fail := func(why string, args ...any) (redisTarget, error) {
		return redisTarget{}, &URLError{URL: shown, Reason: redactSecret(fmt.Sprintf(why, args...), password)}
	}
	if raw == "" {
		return fail("empty")
	}
	if !strings.Contains(raw, "://") {
		return fail("no scheme (want redis:// or rediss://)")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fail("does not parse as a URL (want redis://[user:password@]host[:port][/db])")
	}
	password, _ = u.User.Password()
	shown = redactSecret(shown, password) // the password may appear again, in the path or the query
	switch u.Scheme {
	case "redis", "rediss":
	default:
		return fail("unknown scheme %q (want redis or rediss)", u.Scheme)
	}
	if u.Host == "" || u.Hostname() == "" {
		return fail("no host")
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return fail("takes no query or fragment: the timeouts are configured apart")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fail("port %q: want 1..65535", p)
		}
	}
	opts, err := redis.ParseURL(raw)
	if err != nil {
		// Only the path is left to go wrong here (the database number).
		return fail("the path must be a database number, got %q", u.Path)
	}
	if opts.DB < 0 {
		return fail("database number %d: want 0 or more", opts.DB)
	}
	return redisTarget{options: opts, shown: shown, password: password}, nil
}

// URLError says why a Redis URL cannot be used. It wraps ErrURL, and
// neither of its fields shows the password.
type URLError struct {
	URL    string // the URL, its password redacted
	Reason string // what is wrong with it
}

// Error reads like "fleet: bad Redis URL "<url>": <reason>".
func (e *URLError) Error() string { return fmt.Sprintf("%v %q: %s", ErrURL, e.URL, e.Reason) }

// Unwrap returns ErrURL.
func (e *URLError) Unwrap() error { return ErrURL }

// CheckURL reports whether raw names a Redis server New can use: nil, or a
// *URLError. It lets a caller refuse a bad URL before it builds anything.
func CheckURL(raw string) error {
	_, err := parseURL(raw)
	return err
}

// redactSecret replaces every occurrence of secret in s, for error text
// that comes from elsewhere (a network error quoting what it was given).
func redactSecret(s, secret string) string {
	if secret == "" {
		return s
	}
	return strings.ReplaceAll(s, secret, redactedPassword)
}
