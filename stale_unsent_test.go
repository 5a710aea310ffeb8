package main

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/batchio"
	"dnsproxi/upstream"
)

// fail ends every query h holds with err, no reply.
func (h *heldForwarder) fail(err error) {
	h.mu.Lock()
	held := h.held
	h.held = nil
	h.mu.Unlock()
	for _, s := range held {
		s.done(s.query, nil, err)
	}
}

// The failure-recheck timer (30 s of stale answers without asking) is
// about the upstream failing. A refresh that never left the process (no
// free message ID, a full send queue, no question) says nothing about the
// upstream: its client is answered stale all the same, but the next query
// refreshes again. A refresh that was sent and failed, or came back
// SERVFAIL, or timed out as a slow name, starts the timer as before.
func TestRefreshNeverSentStartsNoRecheck(t *testing.T) {
	tests := []struct {
		err     error // nil: the upstream answers SERVFAIL
		recheck bool
		counted string // the refresh result counted
	}{
		{upstream.ErrBusy, false, "refused"},
		{fmt.Errorf("upstream: sending: %w", batchio.ErrQueueFull), false, "refused"},
		{upstream.ErrNoQuery, false, "refused"},
		{upstream.ErrTimeout, true, "failed"},
		{upstream.ErrNameTimeout, true, "failed"},
		{syscall.ECONNREFUSED, true, "failed"},
		{nil, true, "failed"},
	}
	for _, tt := range tests {
		name := "SERVFAIL"
		if tt.err != nil {
			name = tt.err.Error()
		}
		t.Run(name, func(t *testing.T) {
			r := newLateRig(t, lateRigConfig{cache: true})
			r.prime(t, "www.example.com")
			r.clock.set(tc0.Add(61 * time.Second)) // expired, well inside the window
			w := r.send(t, "udp", "www.example.com", 2)
			waitFor(t, "the refresh at the upstream", func() bool { return r.sent() == 2 })
			if tt.err == nil {
				r.ups[0].end(dns.RcodeServerFailure)
			} else {
				r.ups[0].fail(tt.err)
			}
			wantStale(t, w.answered(t, "the failed refresh")) // inside the window: stale either way
			if got := metric(t, &app{metrics: r.p.metrics}, `dnsproxi_cache_refreshes_total{result="`+tt.counted+`"}`); got != 1 {
				t.Errorf("refreshes %s = %v, want 1", tt.counted, got)
			}

			r.clock.set(tc0.Add(62 * time.Second))
			next := r.send(t, "udp", "www.example.com", 3)
			waitFor(t, "the next query answered or sent", func() bool { return next.writes() > 0 || r.sent() == 3 })
			if tt.recheck {
				wantStale(t, next.answered(t, "the next query"))
				if r.sent() != 2 {
					t.Fatalf("the upstream got %d queries, want none past the failed refresh (recheck timer)", r.sent()-2)
				}
				return
			}
			if next.writes() > 0 {
				t.Fatalf("the next query was answered without a refresh: the recheck timer started, though nothing was sent (%s)", tt.err)
			}
			r.ups[0].end(dns.RcodeSuccess)
			if m := next.answered(t, "the next query"); m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 || m.Answer[0].Header().Ttl != 60 || len(edeCodes(m)) != 0 {
				t.Fatalf("the next query: %s %v EDE %v, want the refresh's fresh answer", rcodeName(m), ttls(m), edeCodes(m))
			}
		})
	}
}
