package main

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"dnsproxi/pool"
)

// The variables of the set of upstreams, named in their errors.
const (
	keyHedge       = "DNS_UPSTREAM_HEDGE"
	keyRetryBudget = "DNS_RETRY_BUDGET"
)

// What one DNS_UPSTREAM entry must be.
const upstreamWant = "host:port such as 127.0.0.1:53, port 1..65535"

// The hedge's own bounds; it must also leave a tenth of DNS_UPSTREAM_TIMEOUT.
const (
	minHedge = time.Millisecond
	maxHedge = 30 * time.Second
)

// Upstreams returns DNS_UPSTREAM's addresses, in the listed order.
func (c Config) Upstreams() []string { return strings.Split(c.Upstream, ",") }

// UpstreamPolicy is DNS_UPSTREAM_POLICY: sequential, round_robin or fastest.
type UpstreamPolicy pool.Policy

// Decode reads a policy's name, in any case.
func (p *UpstreamPolicy) Decode(s string) error {
	policy, err := pool.ParsePolicy(s)
	if err != nil {
		return err
	}
	*p = UpstreamPolicy(policy)
	return nil
}

// String returns the policy's name.
func (p UpstreamPolicy) String() string { return pool.Policy(p).String() }

// Hedge is DNS_UPSTREAM_HEDGE: a duration, off, or unset, which readConfig
// settles to a quarter of DNS_UPSTREAM_TIMEOUT with several upstreams and
// a retry budget, off otherwise.
type Hedge struct {
	After time.Duration // 0: no hedging
	Given bool          // the operator set it (a duration or off)
}

// errHedge is what DNS_UPSTREAM_HEDGE expects.
var errHedge = fmt.Errorf("must be a duration from %v to %v, such as 500ms, or off", minHedge, maxHedge)

// Decode reads "off" or a duration, any case.
func (h *Hedge) Decode(s string) error {
	if strings.EqualFold(s, "off") {
		*h = Hedge{Given: true}
		return nil
	}
	d, err := time.ParseDuration(strings.ToLower(s))
	if err != nil || d < minHedge || d > maxHedge {
		return errHedge
	}
	*h = Hedge{After: d, Given: true}
	return nil
}

// String formats the hedge as it is written in DNS_UPSTREAM_HEDGE.
func (h Hedge) String() string {
	if h.After == 0 {
		return "off"
	}
	return h.After.String()
}

// settleUpstreams reads DNS_UPSTREAM's comma-separated list: 1 to
// pool.MaxMembers entries, each one address under the rule of every
// address variable, none empty, none repeated, none the proxy itself.
// Each is replaced by the address it resolves to.
func (c *Config) settleUpstreams(given envText, listen netip.AddrPort, r resolver) error {
	text := given.or(keyUpstream, c.Upstream)
	entries := strings.Split(c.Upstream, ",")
	if len(entries) > pool.MaxMembers {
		return fmt.Errorf("%s=%q: %d upstreams; at most %d", keyUpstream, text, len(entries), pool.MaxMembers)
	}
	seen := make(map[netip.AddrPort]int, len(entries))
	settled := make([]string, len(entries))
	for i, entry := range entries {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			return fmt.Errorf("%s=%q: entry %d is empty; want %s entries separated by commas", keyUpstream, text, i+1, upstreamWant)
		}
		up, err := resolveAddr(entry, false, r)
		switch {
		case err != nil && len(entries) == 1:
			return addrError(keyUpstream, text, upstreamWant, err)
		case err != nil:
			return entryError(text, i+1, entry, err)
		case loops(listen, up):
			return fmt.Errorf("%s=%q: must not be %s (%v): every query would come back to dnsproxi", keyUpstream, text, keyListen, listen)
		}
		same := netip.AddrPortFrom(up.Addr().Unmap(), up.Port()) // ::ffff:a.b.c.d is a.b.c.d
		if first, ok := seen[same]; ok {
			return fmt.Errorf("%s=%q: entry %d (%v) repeats entry %d", keyUpstream, text, i+1, up, first)
		}
		seen[same] = i + 1
		settled[i] = up.String()
	}
	c.Upstream = strings.Join(settled, ",")
	return nil
}

// entryError is the one-line error for entry n of a DNS_UPSTREAM list.
func entryError(value string, n int, entry string, err error) error {
	if errors.Is(err, errAddrSyntax) {
		return fmt.Errorf("%s=%q: entry %d (%q) must be %s", keyUpstream, value, n, entry, upstreamWant)
	}
	why := strings.ReplaceAll(err.Error(), "\n", " ")
	if transientLookup(err) { // exit 1, restarted: TestAttackTransientLookupFailureExitsAsConfigError, its list case
		return &lookupError{fmt.Sprintf("%s=%q: entry %d (%q): its host could not be looked up for now (%s); try again", keyUpstream, value, n, entry, why)}
	}
	return fmt.Errorf("%s=%q: entry %d (%q) must name a host that resolves (%s)", keyUpstream, value, n, entry, why)
}

// checkFailover settles the hedge's default and applies the rules that tie
// it to the timeout and the budget. A hedge must leave a tenth of the
// deadline for its attempt, and hedges spend the retry budget, so a hedge
// set beside DNS_RETRY_BUDGET=0 is a contradiction.
func (c *Config) checkFailover(given envText) error {
	several := len(c.Upstreams()) > 1
	if !c.UpstreamHedge.Given {
		c.UpstreamHedge.After = 0
		if several && c.RetryBudget > 0 {
			c.UpstreamHedge.After = c.UpstreamTimeout / 4
		}
		return nil
	}
	if c.UpstreamHedge.After == 0 {
		return nil
	}
	if limit := c.UpstreamTimeout * 9 / 10; c.UpstreamHedge.After > limit {
		return fmt.Errorf("%s=%q: must be at most nine tenths of %s (%v): a hedge needs a tenth of the deadline left",
			keyHedge, given[keyHedge], keyUpstreamTimeout, limit)
	}
	if c.RetryBudget == 0 {
		return fmt.Errorf("%s=%q: hedges spend the retry budget, and %s is 0; raise it or set the hedge off",
			keyHedge, given[keyHedge], keyRetryBudget)
	}
	return nil
}
