package upstream

import (
	"testing"
	"time"
)

// forwardUntil is forward with the caller's deadline.
func forwardUntil(u *Upstream, name, network string, deadline time.Time) <-chan error {
	ch := make(chan error, 1)
	b, _ := q(name).Pack()
	u.ForwardUntil(b, network, deadline, func(_, _ []byte, err error) { ch <- err })
	return ch
}

// A caller that has already spent part of a query's time (the set of
// upstreams retrying on another) gives the rest as the deadline: the query
// ends then, not a whole Timeout after it was sent, over UDP and TCP alike.
func TestForwardUntilEndsAtTheCallersDeadline(t *testing.T) {
	srv := newTestServer(t, slowNames)
	u := newUpstream(t, Config{Addr: srv.addr(), Timeout: 2 * time.Second}) // swept every 100ms
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			start := time.Now()
			ch := forwardUntil(u, "slow.example.", network, start.Add(150*time.Millisecond))
			wantTimeout(t, outcome(t, ch), false, Failure)
			if took := time.Since(start); took < 150*time.Millisecond || took > time.Second {
				t.Fatalf("ended after %v, want soon after the 150ms deadline, long before the 2s Timeout", took)
			}
		})
	}
}

// Whether the upstream answered "while the query waited" is judged from
// the moment the query was sent, not from its deadline minus Timeout: an
// answer taken just before a short-deadline query went out vouches for
// nothing, so the query's timeout is a failure.
func TestShortDeadlineJudgedFromItsSending(t *testing.T) {
	srv := newTestServer(t, slowNames)
	u := newUpstream(t, Config{Addr: srv.addr(), Timeout: 2 * time.Second})
	if err := outcome(t, forward(u, "a.example.", "udp")); err != nil {
		t.Fatalf("the earlier answer: %v", err)
	}
	ch := forwardUntil(u, "slow.example.", "udp", time.Now().Add(100*time.Millisecond))
	wantTimeout(t, outcome(t, ch), false, Failure)
}
