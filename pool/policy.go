package pool

import (
	"fmt"
	"strings"

	"dnsproxi/guard"
)

// Policy is how a query's upstream is chosen among those whose breakers
// admit it.
type Policy int

// The policies.
const (
	// Sequential takes the first upstream in the listed order whose breaker
	// admits: a primary with backups. Traffic returns to the primary as soon
	// as its half-open probe succeeds.
	Sequential Policy = iota
	// RoundRobin starts each query one upstream further along the list (an
	// atomic counter), then goes on as Sequential from there.
	RoundRobin
	// Fastest takes the upstream with the lowest smoothed response time
	// whose breaker admits; one query in exploreEvery starts at the next
	// upstream in turn instead, so the others' times stay known. An upstream
	// not yet measured counts as the fastest. Only a good answer counts as
	// fast: a failure, SERVFAIL or REFUSED counts as the whole timeout, so
	// an upstream that fails at once is not preferred.
	Fastest
)

// exploreEvery: Fastest sends one query in this many (5%) elsewhere.
const exploreEvery = 20

var policyNames = []string{"sequential", "round_robin", "fastest"}

// String returns the policy's name as ParsePolicy takes it.
func (p Policy) String() string {
	if p >= 0 && int(p) < len(policyNames) {
		return policyNames[p]
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// ParsePolicy returns the policy named s, in any case.
func ParsePolicy(s string) (Policy, error) {
	for i, n := range policyNames {
		if strings.EqualFold(s, n) {
			return Policy(i), nil
		}
	}
	return 0, fmt.Errorf("must be one of %s", strings.Join(policyNames, ", "))
}

// byTime is the start of a scan that goes by smoothed response time.
const byTime = -1

// firstStart is where the policy starts looking for a new query's upstream:
// an index to scan the list from, or byTime.
func (p *Pool) firstStart() int {
	switch p.policy {
	case RoundRobin:
		return int((p.rotation.Add(1) - 1) % uint64(len(p.members)))
	case Fastest:
		if turn := p.rotation.Add(1); turn%exploreEvery == 0 {
			return int(turn / exploreEvery % uint64(len(p.members)))
		}
		return byTime
	}
	return 0
}

// retryStart is where an extra attempt's scan starts, given the first's:
// the same place, the upstreams already tried left out; by time again
// after Fastest explored.
func (p *Pool) retryStart(first int) int {
	if p.policy == Fastest {
		return byTime
	}
	return first
}

// choose takes the permit of the first upstream, from start in the
// policy's order and not in tried (a bit per upstream), whose breaker
// admits. It allocates nothing.
func (p *Pool) choose(start int, tried uint32) (int, guard.Permit, bool) {
	if start == byTime {
		return p.chooseByTime(tried)
	}
	n := len(p.members)
	for k := range n {
		i := start + k
		if i >= n {
			i -= n
		}
		if tried&(1<<i) != 0 {
			continue
		}
		if permit, ok := p.members[i].acquire(); ok {
			return i, permit, true
		}
	}
	return -1, guard.Permit{}, false
}

// chooseByTime is choose by smoothed response time, lowest first; a
// refusing breaker sends it to the next lowest.
func (p *Pool) chooseByTime(tried uint32) (int, guard.Permit, bool) {
	for {
		best, bestRTT := -1, int64(0)
		for i := range p.members {
			if tried&(1<<i) != 0 {
				continue
			}
			if s := p.members[i].srtt.Load(); best < 0 || s < bestRTT {
				best, bestRTT = i, s
			}
		}
		if best < 0 {
			return -1, guard.Permit{}, false
		}
		if permit, ok := p.members[best].acquire(); ok {
			return best, permit, true
		}
		tried |= 1 << best
	}
}

// acquire asks the member's breaker for a permit; without a breaker it
// always admits, with the zero Permit.
func (m *member) acquire() (guard.Permit, bool) {
	if m.breaker == nil {
		return guard.Permit{}, true
	}
	permit, err := m.breaker.Acquire()
	return permit, err == nil
}
