package pool

import (
	"testing"
	"time"

	"dnsproxi/guard"
	"dnsproxi/upstream"
)

// end reports s with err and no reply, as upstream.Forward would.
func end(s sent, err error) { s.done(s.query, nil, err) }

// An extra attempt's plain timeout is judged with the first attempt, in
// both orders of landing: it costs the backup's breaker nothing when the
// first vouches for a slow name (a slow name's timeout, a late answer, a
// SERVFAIL), and counts as a failure when the first failed too, so two
// silent upstreams still open both breakers. The backup is half-open and
// the extra attempt is its probe: a verdict held and never settled would
// keep that probe out for good, and the backup would refuse every query.
// Each query is reported exactly once.
func TestExtraAttemptsTimeoutIsJudgedWithTheFirst(t *testing.T) {
	type ending struct {
		err error   // the attempt's error; nil: its outcome
		o   outcome // good, servfail, netErr
	}
	nameTimeout := ending{err: upstream.ErrNameTimeout}
	plainTimeout := ending{err: upstream.ErrTimeout}
	tests := []struct {
		name         string
		hedge        bool   // a hedge; else a retry after the first's fast ending
		first, extra ending // how each attempt ends
		extraFirst   bool   // the hedge lands before the first
		wantBackup   guard.State
		wantPrimary  guard.State
	}{
		{"hedge, slow name at both, the hedge lands first", true, nameTimeout, plainTimeout, true, guard.HalfOpen, guard.Closed},
		{"hedge, slow name at both, the first lands first", true, nameTimeout, plainTimeout, false, guard.HalfOpen, guard.Closed},
		{"hedge, the first answers late", true, ending{o: good}, plainTimeout, true, guard.HalfOpen, guard.Closed},
		{"hedge, both silent, the hedge lands first", true, plainTimeout, plainTimeout, true, guard.Open, guard.Open},
		{"hedge, both silent, the first lands first", true, plainTimeout, plainTimeout, false, guard.Open, guard.Open},
		{"hedge, a network error at the backup", true, nameTimeout, ending{o: netErr}, true, guard.Open, guard.Closed},
		{"hedge, the backup's slow name", true, plainTimeout, nameTimeout, true, guard.HalfOpen, guard.Open},
		{"retry after SERVFAIL, slow at the backup", false, ending{o: servfail}, plainTimeout, false, guard.HalfOpen, guard.Closed},
		{"retry after a network error, silent backup", false, ending{o: netErr}, plainTimeout, false, guard.Open, guard.Open},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, rigConfig{n: 2, breakers: true, budget: generous, hedge: 100 * time.Millisecond})
			r.setState(t, 1, readyB) // the extra attempt is the backup's probe
			finishWith := func(s sent, e ending) {
				if e.err != nil {
					end(s, e.err)
					return
				}
				finish(s, e.o)
			}
			if !tt.hedge {
				r.ups[0].decide = func([]byte) outcome { return tt.first.o }
			}
			ch, err := r.ask("judged.example")
			if err != nil {
				t.Fatal(err)
			}
			if tt.hedge {
				hedgerWaits(t, r)
				r.clock.Advance(100 * time.Millisecond)
			}
			waitUntil(t, "the extra attempt", func() bool { return r.ups[1].count() == 1 })
			if b := r.pool.Breaker(1); b.State() != guard.HalfOpen {
				t.Fatalf("the backup's breaker %v with the extra attempt out, want half-open", b.State())
			}
			extra := r.ups[1].takeHeld()[0]
			if !tt.hedge {
				finishWith(extra, tt.extra)
			} else {
				first := r.ups[0].takeHeld()[0]
				if tt.extraFirst {
					finishWith(extra, tt.extra)
					none(t, ch, "with the first attempt still out")
					finishWith(first, tt.first)
				} else {
					finishWith(first, tt.first)
					none(t, ch, "with the hedge still out")
					finishWith(extra, tt.extra)
				}
			}
			wait(t, ch)
			none(t, ch, "after the report")
			// Every breaker hears before the caller: no waiting here.
			if got := r.pool.Breaker(0).State(); got != tt.wantPrimary {
				t.Errorf("the primary's breaker %v, want %v", got, tt.wantPrimary)
			}
			b := r.pool.Breaker(1)
			if got := b.State(); got != tt.wantBackup {
				t.Fatalf("the backup's breaker %v, want %v", got, tt.wantBackup)
			}
			if tt.wantBackup == guard.HalfOpen {
				p, err := b.Acquire()
				if err != nil {
					t.Fatalf("the backup's probe was not given back: %v", err)
				}
				p.Cancel()
			}
		})
	}
}
