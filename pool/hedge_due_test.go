package pool

import (
	"errors"
	"testing"
	"time"
)

// A hedge's time left is judged when it comes due, not when the hedger
// gets to it: reached late, it is still sent while its deadline has not
// passed, even with less than a tenth of it left (on the real clock:
// TestAttackHedgeAtNineTenthsOfTheTimeoutIsSent). Reached only after the
// deadline (a stalled process), it is not sent, since its upstream could
// not answer in time and its timeout would count against it, and it is
// counted.
func TestHedgeIsJudgedWhenItComesDue(t *testing.T) {
	tests := []struct {
		name     string
		hedgerAt time.Duration // when the hedger gets to the hedge due at 100ms
		wantSent bool
	}{
		{"on time", 100 * time.Millisecond, true},
		{"late, under a tenth left", 950 * time.Millisecond, true},
		{"after the deadline", time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, rigConfig{n: 2, budget: generous, hedge: 100 * time.Millisecond, timeout: time.Second})
			r.ups[1].decide = func([]byte) outcome { return good }
			ch, err := r.ask("due.example")
			if err != nil {
				t.Fatal(err)
			}
			hedgerWaits(t, r)
			r.clock.Advance(tt.hedgerAt)
			if tt.wantSent {
				if res := wait(t, ch); rcode(res) != 0 {
					t.Fatalf("rcode %d (%v), want the hedge's answer", rcode(res), res.err)
				}
				if n := r.pool.LateHedges(); n != 0 {
					t.Fatalf("%d late hedges counted for a hedge sent", n)
				}
				return
			}
			waitUntil(t, "the late hedge to be counted", func() bool { return r.pool.LateHedges() == 1 })
			if n := r.ups[1].count(); n != 0 {
				t.Fatalf("%d attempts at the backup after the deadline, want none", n)
			}
			if n := r.obs.retries[RetryHedge].Load(); n != 0 {
				t.Fatalf("%d hedges counted as sent, want none", n)
			}
			finish(r.ups[0].takeHeld()[0], timeout)
			if res := wait(t, ch); res.err == nil {
				t.Fatal("an answer, want the first attempt's timeout")
			}
			none(t, ch, "after the report")
		})
	}
}

// New refuses a hedge that would leave less than a tenth of the timeout:
// such a hedge could never be sent. Nine tenths, the most the
// configuration takes, is accepted.
func TestNewRefusesAHedgeWithoutATenthLeft(t *testing.T) {
	tests := []struct {
		timeout, hedge time.Duration
		want           error
	}{
		{time.Second, 900 * time.Millisecond, nil},
		{time.Second, 900*time.Millisecond + 1, ErrHedgeTooLate},
		{0, 1800 * time.Millisecond, nil}, // the default timeout, 2s
		{0, 2 * time.Second, ErrHedgeTooLate},
		{999_999_999, 999_999_999 * 9 / 10, nil}, // the configuration's rounding
	}
	for _, tt := range tests {
		p, err := New(Config{Members: []Member{{Upstream: answersAtOnce{}}, {Upstream: answersAtOnce{}}},
			Timeout: tt.timeout, Hedge: tt.hedge})
		if !errors.Is(err, tt.want) {
			t.Errorf("timeout %v, hedge %v: %v, want %v", tt.timeout, tt.hedge, err, tt.want)
		}
		if p != nil {
			p.Close()
		}
	}
}
