package pool

import (
	"fmt"
	"testing"
	"time"

	"dnsproxi/guard"
)

// Fastest takes "the lowest smoothed response time", and observe's rule is
// that "a timeout counts in full, so a dead upstream looks slow". But an
// upstream that fails at once — a refused TCP connection, a SERVFAIL from
// a resolver that lost its own way out — has the lowest time of all: its
// failures move its smoothed time towards zero, and Fastest sends it every
// query but the explorers. Beside it a healthy upstream answering in 5 ms
// gets the explorers and the retries the budget allows; the clients get
// the failure. Breakers off (the default, DNS_BREAKER_THRESHOLD=0);
// DNS_RETRY_BUDGET=10. With breakers on, the one failing with SERVFAIL
// keeps its place: a SERVFAIL is an answer, and its breaker stays closed.
func TestAttackFastestDoesNotPreferAnUpstreamThatFailsFast(t *testing.T) {
	for _, tt := range []struct {
		first    outcome
		breakers bool
	}{
		{netErr, false},
		{servfail, false},
		{servfail, true}, // SERVFAIL is an answer: the breaker never opens
	} {
		first := tt.first
		t.Run(fmt.Sprintf("%v,breakers=%v", first, tt.breakers), func(t *testing.T) {
			r := newRig(t, rigConfig{n: 2, policy: Fastest, breakers: tt.breakers, budget: &guard.RetryBudgetConfig{Ratio: 0.1}})
			r.ups[0].decide = func([]byte) outcome { return first } // at once
			r.ups[1].decide = func([]byte) outcome { r.clock.Advance(5 * time.Millisecond); return good }
			const queries = 400
			failed := 0
			for range queries {
				ch, err := r.ask("fast.example")
				if err != nil {
					t.Fatal(err)
				}
				if res := wait(t, ch); rcode(res) != 0 {
					failed++
				}
			}
			// Every attempt at upstream 0 is a first attempt: nothing is
			// retried there (its partner answers). A fair share for an upstream
			// that never answered usefully is the explorers': 1 in 20.
			firsts := r.ups[0].count()
			if firsts > queries/10 {
				t.Fatalf("%d of %d first attempts went to the upstream that fails at once (smoothed %v, the healthy one %v); "+
					"%d clients got a failure while an upstream answering in 5 ms sat by",
					firsts, queries, r.pool.SmoothedRTT(0), r.pool.SmoothedRTT(1), failed)
			}
		})
	}
}
