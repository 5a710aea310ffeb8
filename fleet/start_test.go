package fleet

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"dnsproxi/guard"
)

// switchLog collects a limiter's reports for the test to wait on.
type switchLog struct {
	mu   sync.Mutex
	seen []Switch
	news chan struct{}
}

func newSwitchLog() *switchLog { return &switchLog{news: make(chan struct{}, 1)} }

func (s *switchLog) record(sw Switch) {
	s.mu.Lock()
	s.seen = append(s.seen, sw)
	s.mu.Unlock()
	select {
	case s.news <- struct{}{}:
	default:
	}
}

func (s *switchLog) all() []Switch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Switch(nil), s.seen...)
}

// waitFor waits, at most d, for a report to mode after the first skip
// reports, and returns it.
func (s *switchLog) waitFor(t *testing.T, to Mode, skip int, d time.Duration) Switch {
	t.Helper()
	deadline := time.After(d)
	for {
		for _, sw := range s.all()[min(skip, len(s.all())):] {
			if sw.To == to {
				return sw
			}
		}
		select {
		case <-s.news:
		case <-deadline:
			t.Fatalf("no switch to %v within %v; reports: %+v", to, d, s.all())
		}
	}
}

// TestNewWithoutRedis: a Redis that is not there is no error: the instance
// starts in local mode with the fallback rate, says so once, never shows the
// password, and neither fails open nor refuses everything.
func TestNewWithoutRedis(t *testing.T) {
	clock := guard.NewManualClock(time.Unix(1_700_000_000, 0))
	log := newSwitchLog()
	l, err := New(Config{
		URL:      fmt.Sprintf("redis://:hunter2@127.0.0.1:%d/0", freePort(t)),
		Rate:     1000,
		Burst:    100,
		Fallback: 50, // burst 5, in proportion
		Clock:    clock,
		OnSwitch: log.record,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Mode() != ModeLocal {
		t.Fatalf("mode %v, want local", l.Mode())
	}
	reports := log.all()
	if len(reports) != 1 {
		t.Fatalf("reports %+v, want exactly one", reports)
	}
	sw := reports[0]
	if sw.From != ModeStarting || sw.To != ModeLocal || sw.Rate != 50 || !errors.Is(sw.Err, ErrRedis) {
		t.Errorf("first report %+v, want starting → local at 50/s with an ErrRedis", sw)
	}
	if strings.Contains(sw.Err.Error(), "hunter2") || !strings.Contains(sw.Err.Error(), "xxxxx") {
		t.Errorf("error %q: want the URL shown with its password redacted", sw.Err)
	}
	admitted := 0
	for range 20 {
		if l.Allow(1) {
			admitted++
		}
	}
	if admitted != 5 {
		t.Errorf("admitted %d of 20 at once, want the fallback's burst of 5", admitted)
	}
	clock.Advance(100 * time.Millisecond) // 5 tokens at 50/s
	admitted = 0
	for range 20 {
		if l.Allow(1) {
			admitted++
		}
	}
	if admitted != 5 {
		t.Errorf("admitted %d of 20 after 100 ms at 50/s, want 5", admitted)
	}
	if l.Switches() != 0 {
		t.Errorf("%d switches counted; the start is reported, not counted", l.Switches())
	}
}

// TestNewWithRedis: a Redis that answers starts the instance in shared mode,
// counted in the fleet, with its reserve in hand (10 ms of the rate).
func TestNewWithRedis(t *testing.T) {
	r := startRedis(t)
	log := newSwitchLog()
	l, err := New(Config{URL: r.url(), Rate: 1000, Timeout: 2 * time.Second, OnSwitch: log.record})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	reports := log.all()
	if l.Mode() != ModeShared || len(reports) != 1 || reports[0].From != ModeStarting ||
		reports[0].To != ModeShared || reports[0].Err != nil || reports[0].Instances != 1 {
		t.Fatalf("mode %v, reports %+v; want shared, reported once from starting, 1 instance", l.Mode(), reports)
	}
	if l.Instances() != 1 || l.LeaseTokens() != 10 {
		t.Errorf("%d instances, %d tokens in hand; want 1 and 10", l.Instances(), l.LeaseTokens())
	}
	if !l.Allow(10) {
		t.Error("the tokens in hand were refused")
	}
}

// TestCloseLeavesTheFleet: Close takes the instance out of the membership at
// once and stops its goroutine.
func TestCloseLeavesTheFleet(t *testing.T) {
	r := startRedis(t)
	c := Config{URL: r.url(), Rate: 1000, Timeout: 2 * time.Second}
	a, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	if b.Instances() != 2 {
		t.Fatalf("the second instance sees %d, want 2", b.Instances())
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	select {
	case <-a.done:
	default:
		t.Error("the goroutine still runs after Close")
	}
	defer b.Close()
	step := b.callsMade()
	waitUntil(t, 5*time.Second, "the remaining instance to see itself alone", func() bool {
		return b.callsMade() > step && b.Instances() == 1
	})
}

// waitUntil polls cond until it holds, failing the test after d.
func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
