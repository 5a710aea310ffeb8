package upstream

import (
	"errors"
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

// ForwardAt counts the query's time from the caller's reading, not from a
// reading of its own: a query whose caller read the clock most of a Timeout
// ago ends soon after, over UDP and TCP alike; and the outcome comes with
// a reading of the real clock taken once it was known — for a timeout, at
// or after the deadline; for an answer, between the send and the report.
func TestForwardAtCountsFromTheCallersReading(t *testing.T) {
	srv := newTestServer(t, slowNames)
	u := newUpstream(t, Config{Addr: srv.addr(), Timeout: 2 * time.Second}) // swept every 100ms
	type report struct {
		now time.Time
		err error
	}
	forwardAt := func(name, network string, now time.Time) <-chan report {
		ch := make(chan report, 1)
		b, _ := q(name).Pack()
		u.ForwardAt(now, b, network, time.Time{}, func(now time.Time, _, _ []byte, err error) { ch <- report{now, err} })
		return ch
	}
	wait := func(ch <-chan report) report {
		t.Helper()
		select {
		case r := <-ch:
			return r
		case <-time.After(5 * time.Second):
			t.Fatal("no report within 5s")
			return report{}
		}
	}
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			start := time.Now()
			read := start.Add(-1850 * time.Millisecond) // the deadline: 150ms from start
			r := wait(forwardAt("slow.example.", network, read))
			if !errors.Is(r.err, ErrTimeout) {
				t.Fatalf("slow name: %v, want a timeout", r.err)
			}
			if took := time.Since(start); took > time.Second {
				t.Fatalf("ended after %v, want soon after the deadline 150ms away, long before the 2s Timeout", took)
			}
			if deadline := read.Add(2 * time.Second); r.now.Before(deadline) {
				t.Fatalf("the timeout's reading %v is before the deadline %v", r.now, deadline)
			}

			sent := time.Now()
			r = wait(forwardAt("a.example.", network, sent))
			if r.err != nil || r.now.Before(sent) || r.now.After(time.Now()) {
				t.Fatalf("answer (%v) read at %v, want a reading between its send %v and its report", r.err, r.now, sent)
			}
		})
	}
}
