package pool

import (
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
	"dnsproxi/upstream"
)

// atUpstream is a ForwarderAt over a fakeUpstream: it records the reading
// each attempt came with, and reports each outcome with that reading plus
// after, as an upstream's reader would with its batch's.
type atUpstream struct {
	fakeUpstream
	after time.Duration

	mu   sync.Mutex
	nows []time.Time
}

func (f *atUpstream) ForwardAt(now time.Time, query []byte, network string, deadline time.Time, done upstream.ResultAt) {
	f.mu.Lock()
	f.nows = append(f.nows, now)
	f.mu.Unlock()
	f.ForwardUntil(query, network, deadline, func(query, reply []byte, err error) { done(now.Add(f.after), query, reply, err) })
}

// tookObserver records how long each attempt took, as the pool saw it.
type tookObserver struct {
	mu   sync.Mutex
	took []time.Duration
}

func (o *tookObserver) Attempt(_ int, _ AttemptResult, took time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.took = append(o.took, took)
}
func (o *tookObserver) Retry(Reason)     {}
func (o *tookObserver) BudgetExhausted() {}

// reportAt is one report to a ForwardAt caller.
type reportAt struct {
	now time.Time
	err error
}

// forwardAt acquires and forwards a query with the reading now; its one
// report arrives on the returned channel.
func forwardAt(t *testing.T, p *Pool, now time.Time) <-chan reportAt {
	t.Helper()
	x, err := p.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	m := new(dns.Msg)
	m.SetQuestion("at.example.", dns.TypeA)
	b, _ := m.Pack()
	ch := make(chan reportAt, 2)
	x.ForwardAt(now, b, "udp", func(now time.Time, _, _ []byte, err error) { ch <- reportAt{now, err} })
	return ch
}

// ForwardAt on the real clock reads it no more: the query's deadline counts
// from the caller's reading, which the upstream gets as the attempt's
// sending; the attempt's time and the caller's report come from the
// reading its outcome was reported with. A reading an hour old shows that
// none of them is the clock's own.
func TestForwardAtTakesTheCallersReading(t *testing.T) {
	up := &atUpstream{fakeUpstream: fakeUpstream{decide: func([]byte) outcome { return good }}, after: 250 * time.Millisecond}
	obs := &tookObserver{}
	p, err := New(Config{Members: []Member{{Name: "a", Upstream: up}}, Timeout: 30 * time.Second, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })

	now := time.Now().Add(-time.Hour)
	var got reportAt
	select {
	case got = <-forwardAt(t, p, now):
	case <-time.After(5 * time.Second):
		t.Fatal("no report within 5s")
	}
	if got.err != nil || !got.now.Equal(now.Add(250*time.Millisecond)) {
		t.Fatalf("report (%v) at %v, want at the upstream's reading %v", got.err, got.now, now.Add(250*time.Millisecond))
	}
	if len(up.nows) != 1 || !up.nows[0].Equal(now) {
		t.Fatalf("the upstream was given %v, want the caller's reading %v", up.nows, now)
	}
	if d := up.all()[0].deadline; !d.Equal(now.Add(30 * time.Second)) {
		t.Fatalf("deadline %v, want the caller's reading plus Timeout, %v", d, now.Add(30*time.Second))
	}
	if len(obs.took) != 1 || obs.took[0] != 250*time.Millisecond {
		t.Fatalf("the attempt took %v, want 250ms: from the caller's reading to the upstream's", obs.took)
	}
}

// A pool on another clock (a test's) never hands the upstream its readings,
// which are of the real clock: it sends with ForwardUntil, and times and
// reports on its own clock.
func TestForwardAtOnAnotherClock(t *testing.T) {
	clock := guard.NewManualClock(t0)
	up := &atUpstream{after: time.Hour}
	obs := &tookObserver{}
	p, err := New(Config{Members: []Member{{Name: "a", Upstream: up}}, Timeout: 30 * time.Second, Observer: obs, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })

	ch := forwardAt(t, p, t0)
	clock.Advance(time.Second)
	held := up.takeHeld()
	if len(held) != 1 || len(up.nows) != 0 {
		t.Fatalf("%d attempts held, %d through ForwardAt: want 1 through ForwardUntil", len(held), len(up.nows))
	}
	if !held[0].deadline.Equal(t0.Add(30 * time.Second)) {
		t.Fatalf("deadline %v, want the caller's reading plus Timeout", held[0].deadline)
	}
	finish(held[0], good)
	select {
	case got := <-ch:
		if got.err != nil || !got.now.Equal(t0.Add(time.Second)) {
			t.Fatalf("report (%v) at %v, want at the pool's clock, %v", got.err, got.now, t0.Add(time.Second))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no report within 5s")
	}
	if len(obs.took) != 1 || obs.took[0] != time.Second {
		t.Fatalf("the attempt took %v, want 1s on the pool's clock", obs.took)
	}
}
