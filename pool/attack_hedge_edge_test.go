package pool

import (
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
	"dnsproxi/upstream"
)

// deadUntilDeadline is a Forwarder that never answers: each attempt ends
// with ErrTimeout when its deadline passes, as a blackholed upstream's
// would.
type deadUntilDeadline struct{}

func (deadUntilDeadline) ForwardUntil(query []byte, _ string, deadline time.Time, done upstream.Result) {
	q := append([]byte(nil), query...)
	time.AfterFunc(time.Until(deadline), func() { done(q, nil, upstream.ErrTimeout) })
}

// answersAtOnce is a Forwarder that answers NOERROR at once.
type answersAtOnce struct{}

func (answersAtOnce) ForwardUntil(query []byte, _ string, _ time.Time, done upstream.Result) {
	done(query, reply(query, good), nil)
}

// The configuration accepts a hedge of nine tenths of the timeout
// (config_failover.go: "must be at most nine tenths"), and the README
// promises that a query unanswered this long also goes to the next
// upstream. On the real clock the hedger always wakes a little after the
// hedge is due, so less than a tenth of the deadline is left when
// mayExtend looks, and the hedge is never sent: a blackholed primary is
// not failed over, every client waits out the whole timeout.
func TestAttackHedgeAtNineTenthsOfTheTimeoutIsSent(t *testing.T) {
	for _, c := range []struct {
		timeout, hedge time.Duration
	}{
		{200 * time.Millisecond, 180 * time.Millisecond}, // exactly 9/10: accepted by checkFailover
		{1 * time.Second, 900 * time.Millisecond},        // DNS_UPSTREAM_TIMEOUT=1s DNS_UPSTREAM_HEDGE=900ms
	} {
		t.Run(c.hedge.String(), func(t *testing.T) {
			obs := &counter{}
			p, err := New(Config{
				Members:  []Member{{Name: "dead", Upstream: deadUntilDeadline{}}, {Name: "alive", Upstream: answersAtOnce{}}},
				Timeout:  c.timeout,
				Hedge:    c.hedge,
				Budget:   guard.NewRetryBudget(*generous, nil),
				Observer: obs,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Close() })
			const queries = 5 // at once: one timeout's wait for all
			chs := make([]chan error, queries)
			for i := range chs {
				x, err := p.Acquire()
				if err != nil {
					t.Fatal(err)
				}
				m := new(dns.Msg)
				m.SetQuestion("edge.example.", dns.TypeA)
				b, _ := m.Pack()
				ch := make(chan error, 2)
				chs[i] = ch
				x.Forward(b, "udp", func(_, _ []byte, err error) { ch <- err })
			}
			hedged := 0
			for _, ch := range chs {
				select {
				case err := <-ch:
					if err == nil {
						hedged++
					}
				case <-time.After(5 * time.Second):
					t.Fatal("no report within 5s")
				}
			}
			if hedged != queries {
				t.Fatalf("%d of %d queries answered by the hedge (hedges sent: %d, budget refusals: %d); want every one: "+
					"a hedge of %v with a timeout of %v is accepted, and the primary is silent",
					hedged, queries, obs.retries[RetryHedge].Load(), obs.refused.Load(), c.hedge, c.timeout)
			}
		})
	}
}
