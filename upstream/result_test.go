package upstream

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/internal/batchio"
)

// forward sends a query for name over network and returns where its error
// (nil for an answer) will arrive.
func forward(u *Upstream, name, network string) <-chan error {
	ch := make(chan error, 1)
	b, _ := q(name).Pack()
	u.Forward(b, network, func(_, _ []byte, err error) { ch <- err })
	return ch
}

// outcome waits (bounded) for the report forward promised.
func outcome(t *testing.T, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("the query was not reported within 5s")
		return nil
	}
}

// slowNames never answers a name under "slow."; it answers the others at once.
func slowNames(req *dns.Msg, _ bool) []*dns.Msg {
	if strings.HasPrefix(strings.ToLower(req.Question[0].Name), "slow.") { // the name comes in 0x20 case
		return nil
	}
	return []*dns.Msg{answer(req)}
}

// wantTimeout checks that err is a timeout (either kind), of the kind named
// by name, and judged as verdict.
func wantTimeout(t *testing.T, err error, nameTimeout bool, verdict Verdict) {
	t.Helper()
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want a timeout (errors.Is ErrTimeout)", err)
	}
	if got := errors.Is(err, ErrNameTimeout); got != nameTimeout {
		t.Fatalf("err = %v: errors.Is(err, ErrNameTimeout) = %v, want %v", err, got, nameTimeout)
	}
	if got := Judge(nil, err); got != verdict {
		t.Fatalf("Judge(nil, %v) = %v, want %v", err, got, verdict)
	}
}

// A slow name times out while its neighbours are answered: the upstream is
// alive, and the timeout is not held against it.
func TestSlowNameAmongAnsweredNeighbours(t *testing.T) {
	srv := newTestServer(t, slowNames)
	u := newUpstream(t, Config{Addr: srv.addr(), Timeout: 500 * time.Millisecond})
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			slow := forward(u, "slow.example.", network)
			if err := outcome(t, forward(u, "a.example.", network)); err != nil {
				t.Fatalf("the neighbour: %v", err)
			}
			wantTimeout(t, outcome(t, slow), true, Uncounted)
		})
	}
}

// An answer that came before the query was sent vouches for nothing: the
// upstream must answer while the query waits.
func TestAnswerBeforeTheQueryDoesNotCount(t *testing.T) {
	srv := newTestServer(t, slowNames)
	u := newUpstream(t, Config{Addr: srv.addr(), Timeout: 200 * time.Millisecond})
	if err := outcome(t, forward(u, "a.example.", "udp")); err != nil {
		t.Fatalf("the earlier answer: %v", err)
	}
	wantTimeout(t, outcome(t, forward(u, "slow.example.", "udp")), false, Failure)
}

// A dead upstream answers nothing: every timeout is a failure.
func TestDeadUpstreamTimeoutsAreFailures(t *testing.T) {
	srv := newTestServer(t, func(*dns.Msg, bool) []*dns.Msg { return nil })
	u := newUpstream(t, Config{Addr: srv.addr(), Timeout: 200 * time.Millisecond})
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			first, second := forward(u, "a.example.", network), forward(u, "b.example.", network)
			wantTimeout(t, outcome(t, first), false, Failure)
			wantTimeout(t, outcome(t, second), false, Failure)
		})
	}
}

// A uniformly slow upstream answers everything after the deadline. A late
// reply is no answer in time: the next query's timeout is a failure too,
// though the late reply reached the proxy while that query waited.
func TestUniformlySlowUpstreamTimeoutsAreFailures(t *testing.T) {
	up, err := fakeupstream.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { up.Close() })
	const timeout = 300 * time.Millisecond
	up.SetDelay(timeout * 3 / 2) // q1's reply comes halfway through q2's wait
	up.SetMode(fakeupstream.Slow)
	u := newUpstream(t, Config{Addr: up.Addr(), Timeout: timeout})
	wantTimeout(t, outcome(t, forward(u, "q1.example.", "udp")), false, Failure)
	wantTimeout(t, outcome(t, forward(u, "q2.example.", "udp")), false, Failure)
	if udp, _ := up.Received(); udp != 2 {
		t.Fatalf("the upstream received %d queries, want 2", udp)
	}
}

// Replies that do not validate (here: every one under the wrong ID) are not
// answers: they vouch for nothing, so an off-path sender cannot make a dead
// upstream look alive.
func TestInvalidRepliesDoNotVouch(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg {
		m := answer(req)
		m.Id++
		return []*dns.Msg{m}
	})
	u := newUpstream(t, Config{Addr: srv.addr(), Timeout: 200 * time.Millisecond})
	first, second := forward(u, "slow.example.", "udp"), forward(u, "a.example.", "udp")
	wantTimeout(t, outcome(t, first), false, Failure)
	wantTimeout(t, outcome(t, second), false, Failure)
}

// A query cut short by Close says nothing about the upstream.
func TestShutdownIsUncounted(t *testing.T) {
	srv := newTestServer(t, func(*dns.Msg, bool) []*dns.Msg { return nil })
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			u := newUpstream(t, Config{Addr: srv.addr(), Timeout: time.Minute})
			waiting := forward(u, "a.example.", network)
			u.Close()
			err := outcome(t, waiting)
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("err = %v, want ErrClosed", err)
			}
			if got := Judge(nil, err); got != Uncounted {
				t.Fatalf("Judge(nil, %v) = %v, want uncounted", err, got)
			}
		})
	}
}

func TestJudge(t *testing.T) {
	reply := func(rcode int) []byte {
		m := new(dns.Msg)
		m.SetRcode(q("a.example."), rcode)
		b, _ := m.Pack()
		return b
	}
	refused := &net.OpError{Op: "read", Net: "udp", Err: errors.New("connection refused")}
	tests := []struct {
		name  string
		reply []byte
		err   error
		want  Verdict
	}{
		{"NOERROR", reply(dns.RcodeSuccess), nil, Answer},
		{"NXDOMAIN", reply(dns.RcodeNameError), nil, Answer},
		{"SERVFAIL is an answer", reply(dns.RcodeServerFailure), nil, Answer},
		{"REFUSED is an answer", reply(dns.RcodeRefused), nil, Answer},
		{"no reply and no error: no valid reply", nil, nil, Failure},
		{"timeout with nothing answered", nil, ErrTimeout, Failure},
		{"timeout while others were answered", nil, ErrNameTimeout, Uncounted},
		{"wrapped name timeout", nil, fmt.Errorf("exchange: %w", ErrNameTimeout), Uncounted},
		{"network error", nil, refused, Failure},
		{"TCP connection lost", nil, errConnLost, Failure},
		{"shutdown", nil, ErrClosed, Uncounted},
		{"wrapped shutdown", nil, fmt.Errorf("exchange: %w", ErrClosed), Uncounted},
		{"never sent: no free ID", nil, ErrBusy, Uncounted},
		{"never sent: no question", nil, ErrNoQuery, Uncounted},
		{"never sent: the socket's send queue is full", nil, batchio.ErrQueueFull, Uncounted},
		{"never sent: the socket closed under it (shutdown)", nil, net.ErrClosed, Uncounted},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Judge(tt.reply, tt.err); got != tt.want {
				t.Fatalf("Judge = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestVerdictString(t *testing.T) {
	for v, want := range map[Verdict]string{Answer: "answer", Failure: "failure", Uncounted: "uncounted", Verdict(9): "Verdict(9)"} {
		if got := v.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(v), got, want)
		}
	}
}

// BenchmarkJudge judges the two common results, an answer and a plain
// timeout, and the longest path, a wrapped error that matches nothing.
func BenchmarkJudge(b *testing.B) {
	reply := make([]byte, 64)
	other := fmt.Errorf("exchange: %w", errors.New("other"))
	b.ReportAllocs()
	for b.Loop() {
		if Judge(reply, nil) != Answer || Judge(nil, ErrTimeout) != Failure || Judge(nil, other) != Failure {
			b.Fatal("wrong verdict")
		}
	}
}

// BenchmarkMarkAnswered is the stamp every valid reply leaves, from one
// reader and from every core at once (as the socket readers do). The clock
// is read by the caller, once per batch of UDP replies.
func BenchmarkMarkAnswered(b *testing.B) {
	u := &Upstream{epoch: time.Now()}
	now := u.epoch.Add(time.Second)
	b.Run("single", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			u.markAnswered(now)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				u.markAnswered(now)
			}
		})
	})
}
