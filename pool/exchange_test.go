package pool

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
	"dnsproxi/upstream"
)

// generous lets every retry and hedge through.
var generous = &guard.RetryBudgetConfig{Ratio: 1, MinPerSecond: 1000}

// What one query sees when its first attempt ends each way, with a second
// upstream that answers: retried once on the next upstream (fast failures,
// SERVFAIL, REFUSED), or not (a good answer, a timeout with no time left,
// shutdown).
func TestRetryOnce(t *testing.T) {
	tests := []struct {
		first     outcome
		wantSends [2]int // attempts at each upstream
		wantRcode int    // -1: an error
		reason    Reason
		retried   bool
	}{
		{good, [2]int{1, 0}, dns.RcodeSuccess, 0, false},
		{netErr, [2]int{1, 1}, dns.RcodeSuccess, RetryFailure, true},
		{servfail, [2]int{1, 1}, dns.RcodeSuccess, RetryAnswer, true},
		{refused, [2]int{1, 1}, dns.RcodeSuccess, RetryAnswer, true},
		{timeout, [2]int{1, 0}, -1, 0, false}, // judged a failure, but the deadline is gone: see TestNoRetryWithoutTime
		{closed, [2]int{1, 0}, -1, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.first.String(), func(t *testing.T) {
			r := newRig(t, rigConfig{n: 2, budget: generous})
			r.ups[0].decide = func([]byte) outcome { return tt.first }
			r.ups[1].decide = func([]byte) outcome { return good }
			if tt.first == timeout {
				r.ups[0].decide = func([]byte) outcome { r.clock.Advance(30 * time.Second); return timeout }
			}
			ch, err := r.ask("www.example")
			if err != nil {
				t.Fatal(err)
			}
			res := wait(t, ch)
			none(t, ch, "after the report")
			if got := rcode(res); got != tt.wantRcode {
				t.Fatalf("rcode %d (%v), want %d", got, res.err, tt.wantRcode)
			}
			if n0, n1 := r.ups[0].count(), r.ups[1].count(); n0 != tt.wantSends[0] || n1 != tt.wantSends[1] {
				t.Fatalf("attempts %d and %d, want %v", n0, n1, tt.wantSends)
			}
			if got := r.obs.retries[tt.reason].Load(); (got == 1) != tt.retried {
				t.Fatalf("%d retries for reason %v, want retried %v", got, tt.reason, tt.retried)
			}
			if got := r.obs.attempts.Load(); got != int64(tt.wantSends[0]+tt.wantSends[1]) {
				t.Fatalf("the observer heard of %d attempts, want %d", got, tt.wantSends[0]+tt.wantSends[1])
			}
		})
	}
}

func (o outcome) String() string {
	return [...]string{"hold", "good", "servfail", "refused", "netErr", "timeout", "closed"}[o]
}

// Once only: when the retry fails as well, the query is reported with the
// best it has — the SERVFAIL answer kept from the first attempt over the
// retry's network error — and no third attempt goes out.
func TestRetryAtMostOnce(t *testing.T) {
	r := newRig(t, rigConfig{n: 3, budget: generous})
	r.ups[0].decide = func([]byte) outcome { return servfail }
	r.ups[1].decide = func([]byte) outcome { return netErr }
	r.ups[2].decide = func([]byte) outcome { return good }
	ch, _ := r.ask("www.example")
	if res := wait(t, ch); rcode(res) != dns.RcodeServerFailure {
		t.Fatalf("rcode %d (%v), want the kept SERVFAIL", rcode(res), res.err)
	}
	if n := r.ups[2].count(); n != 0 {
		t.Fatalf("a third attempt went out")
	}
}

// An open breaker is never retried through: the retry goes to the next
// upstream whose breaker admits, and with none, there is no retry.
func TestRetrySkipsOpenBreakers(t *testing.T) {
	tests := []struct {
		name   string
		states []state
		want   [3]int // attempts at each upstream
		rcode  int    // -1: the first attempt's error
	}{
		{"past the open one", []state{closedB, openB, closedB}, [3]int{1, 0, 1}, dns.RcodeSuccess},
		{"past the probing one", []state{closedB, probingB, closedB}, [3]int{1, 0, 1}, dns.RcodeSuccess},
		{"none admits", []state{closedB, openB, probingB}, [3]int{1, 0, 0}, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, rigConfig{n: 3, breakers: true, budget: generous})
			for i, st := range tt.states {
				r.setState(t, i, st)
			}
			r.ups[0].decide = func([]byte) outcome { return netErr }
			r.ups[2].decide = func([]byte) outcome { return good }
			ch, err := r.ask("www.example")
			if err != nil {
				t.Fatal(err)
			}
			res := wait(t, ch)
			if got := rcode(res); got != tt.rcode || (got == -1 && !errors.Is(res.err, errNet)) {
				t.Fatalf("rcode %d (%v), want %d", got, res.err, tt.rcode)
			}
			for i, up := range r.ups {
				if n := up.count(); n != tt.want[i] {
					t.Fatalf("%d attempts at upstream %d, want %d", n, i, tt.want[i])
				}
			}
		})
	}
}

// One deadline per query: the retry carries the first attempt's deadline,
// not a fresh one; with less than a tenth of it left, no retry is sent.
func TestNoRetryWithoutTime(t *testing.T) {
	r := newRig(t, rigConfig{n: 2, budget: generous, timeout: time.Second})
	r.ups[1].decide = func([]byte) outcome { return good }
	ch, _ := r.ask("late.example")
	first := r.ups[0].all()[0]
	if want := t0.Add(time.Second); !first.deadline.Equal(want) {
		t.Fatalf("first attempt's deadline %v, want %v", first.deadline, want)
	}
	r.clock.Advance(850 * time.Millisecond)
	finish(r.ups[0].takeHeld()[0], servfail)
	if res := wait(t, ch); rcode(res) != dns.RcodeSuccess {
		t.Fatalf("retried with 150ms left: rcode %d, want the retry's answer", rcode(res))
	}
	if retry := r.ups[1].all()[0]; !retry.deadline.Equal(first.deadline) {
		t.Fatalf("the retry's deadline %v, want the query's %v", retry.deadline, first.deadline)
	}

	ch, _ = r.ask("later.example")
	r.clock.Advance(950 * time.Millisecond) // 50ms left: under a tenth
	finish(r.ups[0].takeHeld()[0], netErr)
	if res := wait(t, ch); !errors.Is(res.err, errNet) {
		t.Fatalf("with 50ms left: %v, want the first attempt's error and no retry", res.err)
	}
	if n := r.ups[1].count(); n != 1 {
		t.Fatalf("%d attempts at upstream 1, want only the first query's retry", n)
	}
}

// The budget caps retries: 100 queries failing fast at the first upstream
// get 10 retries (10%), not 100; the rest are refused and counted.
func TestRetriesWithinTheBudget(t *testing.T) {
	r := newRig(t, rigConfig{n: 2, budget: &guard.RetryBudgetConfig{Ratio: 0.1, MinPerSecond: 3}})
	r.ups[0].decide = func([]byte) outcome { return netErr }
	r.ups[1].decide = func([]byte) outcome { return netErr }
	for range 100 {
		ch, _ := r.ask("www.example")
		wait(t, ch)
	}
	if n := r.ups[1].count(); n != 10 {
		t.Fatalf("%d retries for 100 queries, want 10", n)
	}
	if got := r.obs.refused.Load(); got != 90 {
		t.Fatalf("budget refusals counted %d, want 90", got)
	}
}

// No retry and no hedge with one upstream, or without a budget.
func TestNoExtraAttempts(t *testing.T) {
	for _, tt := range []struct {
		name   string
		n      int
		budget *guard.RetryBudgetConfig
	}{
		{"one upstream", 1, generous},
		{"no budget", 2, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, rigConfig{n: tt.n, budget: tt.budget, hedge: 100 * time.Millisecond})
			if r.pool.Hedging() {
				t.Fatal("a hedger was started")
			}
			r.ups[0].decide = func([]byte) outcome { return netErr }
			ch, _ := r.ask("www.example")
			if res := wait(t, ch); !errors.Is(res.err, errNet) {
				t.Fatalf("%v, want the only attempt's error", res.err)
			}
			if got := r.obs.attempts.Load(); got != 1 {
				t.Fatalf("%d attempts, want 1", got)
			}
		})
	}
}

// A hedge: the first upstream has not answered after the hedge delay, the
// second answers, and the client has that answer at once. The first
// attempt's answer, coming late, never reaches the client a second time;
// it still reports to its own breaker (here a timeout: a failure that
// opens it), and the Exchange is reused cleanly afterwards.
func TestHedgeAndTheLateAnswer(t *testing.T) {
	for _, late := range []outcome{good, timeout, servfail} {
		t.Run(late.String(), func(t *testing.T) {
			r := newRig(t, rigConfig{n: 2, breakers: true, budget: generous, hedge: 100 * time.Millisecond, timeout: time.Second})
			r.ups[1].decide = func([]byte) outcome { return good }
			ch, _ := r.ask("hedged.example")
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := r.clock.BlockUntilWaiters(ctx, 1); err != nil {
				t.Fatal("the hedger never waited for the hedge:", err)
			}
			r.clock.Advance(99 * time.Millisecond)
			none(t, ch, "before the hedge delay")
			if n := r.ups[1].count(); n != 0 {
				t.Fatal("hedged before the delay")
			}
			r.clock.Advance(time.Millisecond)
			res := wait(t, ch)
			if rcode(res) != dns.RcodeSuccess || r.obs.retries[RetryHedge].Load() != 1 {
				t.Fatalf("after the hedge delay: rcode %d (%v), %d hedges; want the second upstream's answer",
					rcode(res), res.err, r.obs.retries[RetryHedge].Load())
			}
			if got := r.ups[1].all()[0]; !got.deadline.Equal(r.ups[0].all()[0].deadline) {
				t.Fatal("the hedge has a deadline of its own")
			}

			finish(r.ups[0].takeHeld()[0], late) // the first attempt ends, late
			none(t, ch, "the late answer")
			wantState := guard.Closed
			if late == timeout {
				wantState = guard.Open
			}
			if s := r.pool.Breaker(0).State(); s != wantState {
				t.Fatalf("the late attempt's breaker is %v, want %v: it must hear of its own attempt", s, wantState)
			}
			if got := r.obs.attempts.Load(); got != 2 {
				t.Fatalf("the observer heard of %d attempts, want both", got)
			}

			r.nextQueryReusesExchange(t, ch) // the Exchange is back in the pool
		})
	}
}

// While a hedge is out, a failure or a SERVFAIL from the first attempt
// does not end the query: the hedge may still bring the answer. If the
// hedge fails too, the kept SERVFAIL is the report.
func TestFailureWhileTheHedgeIsOutWaitsForIt(t *testing.T) {
	for _, tt := range []struct {
		first, hedge outcome
		rcode        int
	}{
		{servfail, good, dns.RcodeSuccess},
		{netErr, good, dns.RcodeSuccess},
		{servfail, netErr, dns.RcodeServerFailure},
		{netErr, refused, dns.RcodeRefused},
	} {
		t.Run(tt.first.String()+","+tt.hedge.String(), func(t *testing.T) {
			r := newRig(t, rigConfig{n: 3, budget: generous, hedge: 100 * time.Millisecond})
			ch, _ := r.ask("www.example")
			hedgerWaits(t, r)
			r.clock.Advance(100 * time.Millisecond)
			waitUntil(t, "the hedge", func() bool { return r.ups[1].count() == 1 })
			finish(r.ups[0].takeHeld()[0], tt.first)
			none(t, ch, "while the hedge is out")
			finish(r.ups[1].takeHeld()[0], tt.hedge)
			if res := wait(t, ch); rcode(res) != tt.rcode {
				t.Fatalf("rcode %d (%v), want %d", rcode(res), res.err, tt.rcode)
			}
			if n := r.ups[2].count(); n != 0 {
				t.Fatal("a third attempt went out")
			}
		})
	}
}

// A hedge that comes due after its query was answered, or retried, sends
// nothing; the hedges are sent in the order they come due, so once a later
// query's hedge is out, the earlier ones have been decided.
func TestHedgeAfterTheAnswerSendsNothing(t *testing.T) {
	r := newRig(t, rigConfig{n: 2, budget: generous, hedge: 100 * time.Millisecond})
	answered, _ := r.ask("answered.example")
	finish(r.ups[0].takeHeld()[0], good)
	wait(t, answered)
	retried, _ := r.ask("retried.example")
	finish(r.ups[0].takeHeld()[0], netErr) // retried at upstream 1, which holds it
	hedged, _ := r.ask("hedged.example")
	hedgerWaits(t, r)
	r.clock.Advance(100 * time.Millisecond) // all three hedges come due
	waitUntil(t, "the third query's hedge", func() bool { return r.ups[1].count() == 2 })
	if n0, h := r.ups[0].count(), r.obs.retries[RetryHedge].Load(); n0 != 3 || h != 1 {
		t.Fatalf("%d attempts at upstream 0 and %d hedges, want 3 and 1", n0, h)
	}
	for _, up := range r.ups {
		for _, s := range up.takeHeld() {
			finish(s, good)
		}
	}
	for _, ch := range []<-chan result{retried, hedged} {
		if res := wait(t, ch); rcode(res) != dns.RcodeSuccess {
			t.Fatal(res.err)
		}
		none(t, ch, "a second report")
	}
}

// A Valid that refuses a reply makes it a failure: retried, and held
// against the upstream's breaker.
func TestInvalidReplyIsAFailure(t *testing.T) {
	r := newRig(t, rigConfig{n: 2, breakers: true, budget: generous})
	r.pool.valid = func(query, reply []byte) bool { return false }
	r.ups[0].decide = func([]byte) outcome { return good }
	r.ups[1].decide = func([]byte) outcome { return good }
	ch, _ := r.ask("www.example")
	if res := wait(t, ch); !errors.Is(res.err, errInvalidReply) {
		t.Fatalf("%v, want errInvalidReply", res.err)
	}
	if r.ups[1].count() != 1 || r.pool.Breaker(0).State() != guard.Open {
		t.Fatalf("not retried (%d) or not held against the breaker (%v)", r.ups[1].count(), r.pool.Breaker(0).State())
	}
	if got := r.obs.byResult[AttemptError].Load(); got != 2 {
		t.Fatalf("%d attempts counted as errors, want 2", got)
	}
}

// Every verdict ends a half-open probe's permit as the breaker must hear
// it: an answer closes, a failure re-opens, and an uncounted result decides
// nothing but lets the next query probe at once.
func TestMarkEndsTheProbe(t *testing.T) {
	tests := []struct {
		verdict   upstream.Verdict
		want      guard.State
		nextProbe bool // may the next query probe without another cool-off?
	}{
		{upstream.Answer, guard.Closed, true},
		{upstream.Failure, guard.Open, false},
		{upstream.Uncounted, guard.HalfOpen, true},
	}
	for _, tt := range tests {
		t.Run(tt.verdict.String(), func(t *testing.T) {
			clock := guard.NewManualClock(t0)
			b := guard.NewBreaker(guard.BreakerConfig{MinSamples: 1, CoolOff: time.Second}, clock)
			if p, err := b.Acquire(); err == nil {
				p.Failure() // open
			}
			clock.Advance(time.Second)
			probe, err := b.Acquire()
			if err != nil || b.State() != guard.HalfOpen {
				t.Fatalf("no probe: %v, state %v", err, b.State())
			}
			mark(probe, tt.verdict)
			if s := b.State(); s != tt.want {
				t.Fatalf("after the probe's %v: breaker %v, want %v", tt.verdict, s, tt.want)
			}
			if _, err := b.Acquire(); (err == nil) != tt.nextProbe {
				t.Fatalf("the next query: %v; want let through %v", err, tt.nextProbe)
			}
		})
	}
}

func TestNewRefusesBadMemberCounts(t *testing.T) {
	if _, err := New(Config{}); !errors.Is(err, ErrNoMembers) {
		t.Errorf("no members: %v", err)
	}
	if _, err := New(Config{Members: make([]Member, MaxMembers+1)}); !errors.Is(err, ErrTooManyMembers) {
		t.Errorf("%d members: %v", MaxMembers+1, err)
	}
}

// hedgerWaits returns once the hedger waits on r's clock for its next hedge.
// Advancing the clock before that may let the hedger read the clock before
// the advance and set its alarm after it, a whole delay late.
func hedgerWaits(t *testing.T, r *rig) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.clock.BlockUntilWaiters(ctx, 1); err != nil {
		t.Fatal("the hedger never waited for the hedge:", err)
	}
}
