package pool

import (
	"errors"
	"testing"

	"dnsproxi/upstream"
)

// When the first attempt was sent and failed and the retry never left the
// process (no free message ID: upstream.NotSent), the caller is told the
// failure that was sent, not the retry's ErrBusy: a caller that tells a
// failing upstream from the proxy's own limits by the error (serve-stale's
// failure-recheck timer) must not read an upstream that failed as one that
// was never asked. The retry alone never sent still reports ErrBusy.
func TestRetryNeverSentReportsTheFailureSent(t *testing.T) {
	r := newRig(t, rigConfig{n: 2, budget: generous})
	r.ups[0].decide = func([]byte) outcome { return netErr }
	ch, err := r.ask("www.example")
	if err != nil {
		t.Fatal(err)
	}
	held := r.ups[1].takeHeld()
	if len(held) != 1 {
		t.Fatalf("%d retries held, want 1", len(held))
	}
	held[0].done(held[0].query, nil, upstream.ErrBusy)
	res := wait(t, ch)
	if !errors.Is(res.err, errNet) || upstream.NotSent(res.err) {
		t.Fatalf("reported %v, want the first attempt's network error", res.err)
	}

	r = newRig(t, rigConfig{n: 2, budget: generous})
	r.ups[0].decide = func([]byte) outcome { return hold }
	ch, err = r.ask("www.example")
	if err != nil {
		t.Fatal(err)
	}
	held = r.ups[0].takeHeld()
	if len(held) != 1 {
		t.Fatalf("%d attempts held, want 1", len(held))
	}
	held[0].done(held[0].query, nil, upstream.ErrBusy)
	if res := wait(t, ch); !errors.Is(res.err, upstream.ErrBusy) {
		t.Fatalf("reported %v, want ErrBusy: nothing was sent", res.err)
	}
}
