package pool

import (
	"testing"
	"time"
)

// An Exchange Acquire returned and Cancel gave back leaves no trace on its
// upstream's breaker: a half-open probe's place is free again at once (the
// proxy cancels the Exchange of a query that joins, at the last moment, a
// flight an identical query started), and the Exchange serves the next
// query.
func TestCancelFreesTheProbe(t *testing.T) {
	r := newRig(t, rigConfig{n: 1, breakers: true})
	b := r.pool.members[0].breaker
	p, err := b.Acquire()
	if err != nil {
		t.Fatal(err)
	}
	p.Failure() // one failure of one sample: open
	r.clocks[0].Advance(time.Second)
	x, err := r.pool.Acquire() // the half-open probe
	if err != nil {
		t.Fatalf("after the cool-off: %v, want the probe", err)
	}
	if _, err := r.pool.Acquire(); err == nil {
		t.Fatal("a second call admitted while the probe is out")
	}
	x.Cancel()
	r.ups[0].decide = func([]byte) outcome { return good }
	ch, err := r.ask("after.example")
	if err != nil {
		t.Fatalf("after Cancel: %v, want the probe's place free", err)
	}
	if res := wait(t, ch); res.err != nil || len(res.reply) == 0 {
		t.Fatalf("the query after Cancel: %v", res.err)
	}
}
