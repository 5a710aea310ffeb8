package upstream

import (
	"fmt"
	"testing"
	"time"
)

// Tests from an adversarial review of the day's changes (TestDiff...).

// A farm behind one address, half its backends folding case, and no TCP
// listener (a UDP-only upstream, common behind load balancers). Before
// the TCP fetch, a query that met a folding backend timed out while the
// upstream answered the others: ErrNameTimeout, Uncounted, a slow name and
// not a sick upstream. Now it is fetched over TCP, the dial is refused,
// and it ends with errConnLost, a Failure: half the queries of an upstream
// that answers every other one over UDP count against its breaker, at the
// default FailThreshold (0.5) enough to open it, and every client of it
// is refused, where before only the queries that met a folding backend
// failed.
func TestDiffFoldingFarmWithoutTCPLeavesTheBreakerAlone(t *testing.T) {
	srv := farmServer(t)
	srv.tcp.Close()
	u := newUpstream(t, Config{Addr: srv.addr(), Timeout: 300 * time.Millisecond})
	exchangeOK(t, u, "First.Farm.Example.")
	const n = 20
	r := newReplies(n)
	for i := range n {
		r.forward(u, fmt.Sprintf("Host%d.Farm.Example.", i))
	}
	failed := r.wait(t, 5*time.Second)
	r.mu.Lock()
	defer r.mu.Unlock()
	failures := 0
	for _, err := range r.errs {
		if err != nil && Judge(nil, err) == Failure {
			failures++
		}
	}
	if failures*2 >= n {
		t.Fatalf("%d of %d queries to an upstream that answers UDP judged Failure (breaker threshold 0.5), %+v: %v",
			failures, n, u.Stats(), failed[0])
	}
}
