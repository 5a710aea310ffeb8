package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
)

// stallWriter is a log's stderr that blocks every write while stalled, as
// a pipe does whose reader has stopped (a journald that stalls, a
// terminal on Ctrl-S), and lets them through once released.
type stallWriter struct {
	mu      sync.Mutex
	stalled chan struct{} // nil: writes go through
}

func (w *stallWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	ch := w.stalled
	w.mu.Unlock()
	if ch != nil {
		<-ch
	}
	return len(b), nil
}

func (w *stallWriter) stall() {
	w.mu.Lock()
	w.stalled = make(chan struct{})
	w.mu.Unlock()
}

func (w *stallWriter) release() {
	w.mu.Lock()
	if w.stalled != nil {
		close(w.stalled)
		w.stalled = nil
	}
	w.mu.Unlock()
}

// The fleet's switch log runs on a goroutine of its own because its
// caller "must never wait for a slow stderr" (outbound.go), and the query
// log "never slows a query". The breakers' log line does not: it is
// written by whichever goroutine made the transition (upstreams.go,
// OnStateChange), here one of the upstream's UDP reply readers (one per
// socket, 8 sockets). With stderr stalled when the breaker opens, that
// reader never comes back: the upstream heals, the breaker closes, and
// every query sent on that reader's socket (one in 8) waits out the whole
// timeout for a SERVFAIL, for as long as stderr stays stalled. (Had the
// transition been made by the upstream's sweeper, every later query of
// that upstream without an answer would never be ended at all.)
func TestAttackStalledStderrDoesNotStopTheUpstreamsReplies(t *testing.T) {
	up := startUpstream(t)
	unreadable := func(req *dns.Msg, _ string) [][]byte {
		b, _ := fakeupstream.Answer(req).Pack()
		return [][]byte{b[:len(b)-3]} // the header and question whole, the record cut short
	}
	up.SetScript(unreadable)
	cfg := testConfig(up.Addr())
	cfg.UpstreamTimeout, cfg.BreakerCoolOff = 300*time.Millisecond, 400*time.Millisecond
	cfg.BreakerThreshold, cfg.BreakerMinSamples, cfg.BreakerWindow = 50, 5, 10
	stderr := &stallWriter{}
	a, err := newApp(cfg, guard.RealClock{}, slog.New(slog.NewTextHandler(stderr, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stderr.release() // before the shutdown, which logs too
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.shutdown(ctx)
	})

	stderr.stall()
	for i := range 5 { // five unreadable replies: the breaker opens
		tryAsk("udp", a.addr(), query(fmt.Sprintf("bad%d.example.com", i), dns.TypeA), time.Second)
	}
	up.SetScript(nil) // healed
	if s := a.breaker(0).State(); s != guard.Open {
		t.Fatalf("after five unreadable replies the breaker is %v, want open", s)
	}
	deadline := time.Now().Add(4 * time.Second)
	for i := 0; ; i++ { // the cool-off, then a probe that is answered
		r, err := tryAsk("udp", a.addr(), query(fmt.Sprintf("probe%d.example.com", i), dns.TypeA), time.Second)
		if err == nil && r.Rcode == dns.RcodeSuccess {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no query answered in 4 s (ten cool-offs) after the upstream healed; the breaker is %v", a.breaker(0).State())
		}
		time.Sleep(50 * time.Millisecond)
	}
	const queries = 64
	var failed atomic.Int64
	var wg sync.WaitGroup
	for i := range queries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := tryAsk("udp", a.addr(), query(fmt.Sprintf("ok%d.example.com", i), dns.TypeA), 2*time.Second)
			if err != nil || r.Rcode != dns.RcodeSuccess {
				failed.Add(1)
			}
		}()
		time.Sleep(2 * time.Millisecond)
	}
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d of %d queries to the healed upstream failed (SERVFAIL after the whole timeout) while stderr is stalled: "+
			"the reply reader that logged the breaker's opening still waits on stderr, and the queries sent on its socket are never answered", n, queries)
	}
}
