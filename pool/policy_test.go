package pool

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"dnsproxi/guard"
)

// state is what a test puts one upstream's breaker in.
type state int

const (
	closedB  state = iota
	openB          // tripped, cool-off running
	readyB         // tripped, cool-off passed: the next Acquire probes
	probingB       // half-open with its probe out: refuses
)

func (s state) String() string { return [...]string{"closed", "open", "ready", "probing"}[s] }

// setState drives upstream i's breaker (MinSamples 1, CoolOff 1s) to s on
// its own clock.
func (r *rig) setState(t *testing.T, i int, s state) {
	t.Helper()
	b := r.pool.Breaker(i)
	if s == closedB {
		return
	}
	p, err := b.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	p.Failure()
	if s == openB {
		return
	}
	r.clocks[i].Advance(time.Second)
	if s == probingB {
		if _, err := b.Acquire(); err != nil || b.State() != guard.HalfOpen {
			t.Fatalf("no probe: %v, %v", err, b.State())
		}
	}
}

// Each policy's choice with the breakers in every state: the choice is the
// first admitting upstream in the policy's order, a ready breaker's probe
// is a real query's, and when every breaker refuses, ErrOpen.
func TestPolicyChoice(t *testing.T) {
	tests := []struct {
		policy Policy
		states []state
		srtt   []time.Duration // Fastest's smoothed response times
		want   []int           // the upstream of each query in turn; -1: ErrOpen
	}{
		{Sequential, []state{closedB, closedB, closedB}, nil, []int{0, 0, 0, 0}},
		{Sequential, []state{openB, closedB, closedB}, nil, []int{1, 1, 1}},
		{Sequential, []state{openB, openB, closedB}, nil, []int{2, 2}},
		{Sequential, []state{readyB, closedB, closedB}, nil, []int{0, 1, 1}}, // the probe, then the backup while it is out
		{Sequential, []state{probingB, openB, closedB}, nil, []int{2, 2}},
		{Sequential, []state{openB, probingB, openB}, nil, []int{-1, -1}},
		{Sequential, []state{readyB, readyB, openB}, nil, []int{0, 1, -1}}, // each ready breaker gives one probe
		{RoundRobin, []state{closedB, closedB, closedB}, nil, []int{0, 1, 2, 0, 1, 2}},
		{RoundRobin, []state{closedB, openB, closedB}, nil, []int{0, 2, 2, 0, 2, 2}},
		{RoundRobin, []state{openB, readyB, closedB}, nil, []int{1, 2, 2, 2, 2, 2}}, // the probe, found from 0
		{RoundRobin, []state{openB, openB, openB}, nil, []int{-1}},
		{Fastest, []state{closedB, closedB, closedB}, []time.Duration{30, 10, 20}, []int{1, 1, 1}},
		{Fastest, []state{closedB, openB, closedB}, []time.Duration{30, 10, 20}, []int{2, 2, 2}},
		{Fastest, []state{closedB, readyB, closedB}, []time.Duration{30, 10, 20}, []int{1, 2, 2}},
		{Fastest, []state{closedB, closedB, closedB}, []time.Duration{30, 10, 0}, []int{2, 2}}, // not measured: tried first
		{Fastest, []state{openB, openB, probingB}, []time.Duration{30, 10, 20}, []int{-1}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%v %v %v", tt.policy, tt.states, tt.srtt), func(t *testing.T) {
			r := newRig(t, rigConfig{n: len(tt.states), policy: tt.policy, breakers: true})
			for i, s := range tt.states {
				r.setState(t, i, s)
			}
			for i, d := range tt.srtt {
				r.pool.members[i].srtt.Store(int64(d))
			}
			for q, want := range tt.want {
				x, err := r.pool.Acquire()
				got := -1
				if err == nil {
					got = x.att[0].member
				} else if !errors.Is(err, guard.ErrOpen) {
					t.Fatalf("query %d: %v", q, err)
				}
				if got != want {
					t.Fatalf("query %d went to %d, want %d", q, got, want)
				}
			}
		})
	}
}

// Fastest sends about one query in twenty elsewhere, in turn, so that the
// other upstreams' times stay known.
func TestFastestExplores(t *testing.T) {
	r := newRig(t, rigConfig{n: 3, policy: Fastest})
	for i, d := range []time.Duration{30, 10, 20} {
		r.pool.members[i].srtt.Store(int64(d))
	}
	got := make([]int, 3)
	for range 600 {
		x, err := r.pool.Acquire()
		if err != nil {
			t.Fatal(err)
		}
		got[x.att[0].member]++
	}
	// One in 20 explores (30), starting in turn at each upstream: the fastest's
	// own turns stay with it.
	if got[0] != 10 || got[2] != 10 || got[1] != 580 {
		t.Fatalf("600 queries went %v, want [10 580 10]", got)
	}
}

// Under sequential, a healed primary gets the probe from a real query and,
// once the probe's answer closes its breaker, all the traffic again.
func TestSequentialReturnsToTheHealedPrimary(t *testing.T) {
	r := newRig(t, rigConfig{n: 2, policy: Sequential, breakers: true})
	r.ups[0].decide = func([]byte) outcome { return good }
	r.ups[1].decide = func([]byte) outcome { return good }
	r.setState(t, 0, openB)
	for range 3 {
		ch, err := r.ask("backup.example")
		if err != nil {
			t.Fatal(err)
		}
		wait(t, ch)
	}
	if n0, n1 := r.ups[0].count(), r.ups[1].count(); n0 != 0 || n1 != 3 {
		t.Fatalf("while the primary is open: %d and %d queries, want 0 and 3", n0, n1)
	}
	r.clocks[0].Advance(time.Second) // the cool-off passes
	ch, err := r.ask("probe.example")
	if err != nil {
		t.Fatal(err)
	}
	if res := wait(t, ch); res.err != nil {
		t.Fatal(res.err)
	}
	if s := r.pool.Breaker(0).State(); s != guard.Closed {
		t.Fatalf("the primary's breaker is %v after its probe answered, want closed", s)
	}
	for range 3 {
		ch, _ := r.ask("back.example")
		wait(t, ch)
	}
	if n0, n1 := r.ups[0].count(), r.ups[1].count(); n0 != 4 || n1 != 3 {
		t.Fatalf("after the probe: %d and %d queries, want 4 (the probe and 3) and 3", n0, n1)
	}
}

func TestParsePolicy(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Policy
		ok   bool
	}{
		{"sequential", Sequential, true}, {"ROUND_ROBIN", RoundRobin, true}, {"Fastest", Fastest, true},
		{"random", 0, false}, {"round-robin", 0, false}, {"", 0, false},
	} {
		got, err := ParsePolicy(tt.in)
		if (err == nil) != tt.ok || (tt.ok && got != tt.want) {
			t.Errorf("ParsePolicy(%q) = %v, %v", tt.in, got, err)
		}
		if tt.ok && got.String() != policyNames[tt.want] {
			t.Errorf("%v.String() = %q", got, got.String())
		}
	}
}
