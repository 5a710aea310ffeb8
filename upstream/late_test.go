package upstream

import (
	"errors"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// "A reply that arrives after its own query's deadline answers nothing and
// stamps nothing: late is not in time, so a uniformly slow upstream still
// fails" (result.go). A query leaves the table when the sweeper passes,
// every Timeout/20 (up to 100 ms); a reply that comes after the deadline
// but before that pass must not be taken as the answer. Here the upstream
// answers everything 3 ms after the deadline: every query must end with
// ErrTimeout (not ErrNameTimeout: nothing was answered in time), a Failure
// for the breaker, over UDP and over TCP. Before the fix 6 of 10 UDP
// queries took their late reply, judged Answer.
func TestLateReplyIsNotAnAnswer(t *testing.T) {
	const timeout = 200 * time.Millisecond // sweeps every 10 ms
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg {
		time.Sleep(timeout + 3*time.Millisecond) // the upstream's latency: just past the deadline
		return []*dns.Msg{answer(req)}
	})
	type result struct {
		took    time.Duration
		reply   bool
		verdict Verdict
		err     error
	}
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			u := newUpstream(t, Config{Addr: srv.addr(), Timeout: timeout})
			wrong := 0
			var last result
			for i := range 10 {
				ch := make(chan result, 1)
				b, _ := q("late.example.").Pack()
				sent := time.Now()
				u.Forward(b, network, func(_, reply []byte, err error) {
					ch <- result{time.Since(sent), reply != nil, Judge(reply, err), err}
				})
				select {
				case r := <-ch:
					if r.reply || !errors.Is(r.err, ErrTimeout) || errors.Is(r.err, ErrNameTimeout) || r.verdict != Failure {
						wrong++
						last = r
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("query %d not reported", i)
				}
			}
			if wrong > 0 {
				t.Fatalf("%d of 10 queries answered only after their deadline did not end as a failing timeout: the last took %v, "+
					"reply %v, err %v, judged %v", wrong, last.took.Round(time.Millisecond), last.reply, last.err, last.verdict)
			}
		})
	}
}

// take judges a reply by the reading it is given: at or before the
// deadline an answer is taken as one; after it, the answer or a
// case-changed reply takes the query out as late, anything else leaves it.
// Only an exact answer in time leaves its reply time and question for the
// probes.
func TestTakeJudgesTheDeadline(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	deadline := t0.Add(time.Second)
	query, _ := q("late.example.").Pack()
	qend, _ := wire.QuestionEnd(query)
	exact := func(c *call) []byte {
		r := append([]byte(nil), c.wire...)
		r[2] |= 0x80 // QR
		return r
	}
	changed := func(c *call) []byte {
		r := exact(c)
		for i := wire.HeaderLen; i < wire.HeaderLen+len(c.name); i++ {
			if isLetter(r[i]) {
				r[i] ^= 0x20
			}
		}
		return r
	}
	otherType := func(c *call) []byte {
		r := exact(c)
		r[c.qend-3] ^= 0x1c // A becomes AAAA
		return r
	}
	for _, tt := range []struct {
		name    string
		tcp     bool // pending.take, as the TCP reader uses it: the name went out in the caller's case
		reply   func(*call) []byte
		now     time.Time
		want    verdict
		taken   bool
		noteRTT bool
	}{
		{"udp: answer before the deadline", false, exact, deadline.Add(-time.Millisecond), replyAnswers, true, true},
		{"udp: answer at the deadline", false, exact, deadline, replyAnswers, true, true},
		{"udp: answer after the deadline", false, exact, deadline.Add(time.Nanosecond), replyLate, true, false},
		{"udp: case changed after the deadline", false, changed, deadline.Add(time.Millisecond), replyLate, true, false},
		{"udp: case changed before the deadline", false, changed, deadline.Add(-time.Millisecond), replyCaseChanged, false, false},
		{"udp: another question after the deadline", false, otherType, deadline.Add(time.Millisecond), replyForeign, false, false},
		{"tcp: answer before the deadline", true, exact, deadline.Add(-time.Millisecond), replyAnswers, true, false},
		{"tcp: answer after the deadline", true, exact, deadline.Add(time.Nanosecond), replyLate, true, false},
		{"tcp: another question after the deadline", true, otherType, deadline.Add(time.Millisecond), replyForeign, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			u := &Upstream{cfg: Config{Timeout: time.Second}, epoch: t0}
			s := &udpSocket{u: u, pending: make(pending)}
			c := newCall(u, query, qend, func(_, _ []byte, _ error) {}, t0, deadline)
			c.lastSent = t0
			if !tt.tcp {
				c.mixed = mixCase(c.wire[wire.HeaderLen:wire.HeaderLen+len(c.name)], &s.rng)
			}
			if err := s.pending.add(c, &s.rng); err != nil {
				t.Fatal(err)
			}
			var got *call
			var v verdict
			if tt.tcp {
				got, v = s.pending.take(tt.reply(c), tt.now)
			} else {
				got, v, _ = s.take(tt.reply(c), tt.now)
			}
			if v != tt.want || (got != nil) != tt.taken || (len(s.pending) == 0) != tt.taken {
				t.Fatalf("verdict %d, taken %v, %d left waiting; want verdict %d, taken %v", v, got != nil, len(s.pending), tt.want, tt.taken)
			}
			quick, noted := u.cases.quickest.get()
			if noted != tt.noteRTT || (noted && quick != tt.now.Sub(t0)) || (len(s.known) > 0) != tt.noteRTT {
				t.Fatalf("quickest reply %v (%v), known question %q; want one noted: %v", quick, noted, s.known, tt.noteRTT)
			}
		})
	}
}

// Whoever takes a query out past its deadline ends it with pastDeadline: a
// timeout of the kind result.go says, or, for a probe that had a
// case-changed reply in time and no exact one, errCaseChanged.
func TestPastDeadline(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name             string
		probe, suspect   bool
		answeredMeantime bool
		want             error
	}{
		{"query, nothing answered meanwhile", false, false, false, ErrTimeout},
		{"query, others answered meanwhile", false, false, true, ErrNameTimeout},
		{"suspect query", false, true, false, ErrTimeout},
		{"probe with no reply", true, false, false, ErrTimeout},
		{"probe with a case-changed reply and no exact one", true, true, false, errCaseChanged},
	} {
		t.Run(tt.name, func(t *testing.T) {
			u := &Upstream{cfg: Config{Timeout: time.Second}, epoch: t0}
			c := &call{sent: t0.Add(time.Second), deadline: t0.Add(2 * time.Second), probe: tt.probe, suspect: tt.suspect}
			if tt.answeredMeantime {
				u.markAnswered(t0.Add(1500 * time.Millisecond))
			}
			if err := u.pastDeadline(c); err != tt.want {
				t.Fatalf("pastDeadline = %v, want %v", err, tt.want)
			}
		})
	}
}
