package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// foldedAnswer is req's answer from a resolver that folds names to lower
// case: the question and the owner name both.
func foldedAnswer(req *dns.Msg) *dns.Msg {
	m := answer(req)
	name := strings.ToLower(req.Question[0].Name)
	m.Question[0].Name = name
	m.Answer[0].Header().Name = name
	return m
}

// farmServer is one upstream address in front of a resolver farm whose
// backends answer UDP queries in turn, one echoing the case exactly, the
// next folding the name to lower case; over TCP a folding backend answers.
func farmServer(t *testing.T) *testServer {
	var udpQueries atomic.Int64
	return newTestServer(t, func(req *dns.Msg, tcp bool) []*dns.Msg {
		if tcp || udpQueries.Add(1)%2 == 0 {
			return []*dns.Msg{foldedAnswer(req)}
		}
		return []*dns.Msg{answer(req)}
	})
}

// replies collects the outcome of n queries, reply included, each reported
// exactly once.
type replies struct {
	mu      sync.Mutex
	reply   map[string]*dns.Msg
	errs    map[string]error
	reports map[string]int
	all     chan struct{}
	n       int
}

func newReplies(n int) *replies {
	return &replies{reply: map[string]*dns.Msg{}, errs: map[string]error{}, reports: map[string]int{}, all: make(chan struct{}), n: n}
}

// forward sends the query for name over UDP through u.
func (r *replies) forward(u *Upstream, name string) {
	b, _ := q(name).Pack()
	u.Forward(b, "udp", func(_, reply []byte, err error) {
		var m *dns.Msg
		if err == nil {
			m = new(dns.Msg)
			if uerr := m.Unpack(reply); uerr != nil {
				m, err = nil, uerr
			}
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.reports[name]++
		if r.reports[name] == 1 {
			r.reply[name], r.errs[name] = m, err
			if len(r.errs) == r.n {
				close(r.all)
			}
		}
	})
}

// wait waits for every report within d, fails the test for a query
// reported twice, and returns the names of those that failed, with why.
func (r *replies) wait(t *testing.T, d time.Duration) []string {
	t.Helper()
	select {
	case <-r.all:
	case <-time.After(d):
		r.mu.Lock()
		defer r.mu.Unlock()
		t.Fatalf("%d of %d queries reported within %v", len(r.errs), r.n, d)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var failed []string
	for name, err := range r.errs {
		if r.reports[name] != 1 {
			t.Errorf("%s reported %d times", name, r.reports[name])
		}
		switch m := r.reply[name]; {
		case err != nil:
			failed = append(failed, fmt.Sprintf("%s: %v", name, err))
		case m.Question[0].Name != name || !m.Answer[0].(*dns.A).A.Equal(net.IPv4(192, 0, 2, 1)):
			failed = append(failed, fmt.Sprintf("%s: answered %v %v", name, m.Question, m.Answer))
		}
	}
	slices.Sort(failed)
	return failed
}

// exchangeOK sends one query over UDP and fails the test unless it is answered.
func exchangeOK(t *testing.T, u *Upstream, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := u.Exchange(ctx, q(name), "udp"); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// Behind one upstream address, a farm where some backends echo case and
// some fold it: the probes are answered exactly by some backend and 0x20
// stays on, so a query that met a folding backend had only a case-changed
// reply and timed out (an earlier review: 7 to 9 of 16 with half the
// backends folding). Once the upstream is known to echo case, such a query
// is fetched over TCP, before the same deadline, and every query is answered.
func TestFarmWithFoldingBackendsAnswersEveryQuery(t *testing.T) {
	srv := farmServer(t)
	u := newUpstream(t, Config{Addr: srv.addr(), Timeout: 500 * time.Millisecond})
	exchangeOK(t, u, "First.Farm.Example.") // the first backend echoes: the upstream is known to echo case
	const n = 16
	r := newReplies(n)
	for i := range n {
		r.forward(u, fmt.Sprintf("Host%d.Farm.Example.", i))
	}
	if failed := r.wait(t, 5*time.Second); len(failed) > 0 {
		t.Fatalf("%d of %d queries to a farm of echoing and folding backends failed:\n%s", len(failed), n, strings.Join(failed, "\n"))
	}
	st := u.Stats()
	srv.mu.Lock()
	accepted := srv.accepted
	srv.mu.Unlock()
	t.Logf("%+v, %d TCP connections", st, accepted)
	if !st.PlainCase && (st.CaseFetches == 0 || st.CaseFetches > n || accepted == 0) {
		t.Fatalf("%+v, %d TCP connections: with 0x20 on, want the queries that met a folding backend fetched over TCP, once each at most", st, accepted)
	}
}

// The TCP fetch of a query whose reply came in another case pays
// Config.AllowExtra like every send the upstream makes on its own: refused,
// the query ends at once with ErrLimited, a query never sent, and goes out
// neither over TCP nor again over UDP.
func TestCaseFetchAsksAllowExtra(t *testing.T) {
	srv := farmServer(t)
	h := newHook(false)
	u := newUpstream(t, Config{Addr: srv.addr(), Timeout: 500 * time.Millisecond, AllowExtra: h.allowExtra})
	exchangeOK(t, u, "First.Farm.Example.") // the caller's send: AllowExtra not asked
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := u.Exchange(ctx, q("Folded.Farm.Example."), "udp") // the second backend folds
	srv.mu.Lock()
	names, accepted := slices.Clone(srv.names), srv.accepted
	srv.mu.Unlock()
	if !errors.Is(err, ErrLimited) || !NotSent(err) || accepted != 0 || len(names) != 2 || u.Stats().CaseFetches != 0 {
		t.Fatalf("with AllowExtra refusing: %v, %d TCP connections, the upstream read %q; want ErrLimited, no connection, 2 queries read",
			err, accepted, names)
	}
}

// An upstream that folds every name never answers exactly, so it is not
// known to echo case: its case-changed replies are no sign of a folding
// backend beside echoing ones, and nothing is fetched over TCP. The
// queries of its first moments wait for the probe series, as before, which
// switches 0x20 off and sends them again in the caller's case: a folding
// upstream under load does not turn each of them into a TCP connection.
func TestFoldingUpstreamIsProbedNotFetched(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg { return []*dns.Msg{foldedAnswer(req)} })
	u := newUpstream(t, Config{Addr: srv.addr(), Timeout: 2 * time.Second})
	const n = 16
	r := newReplies(n)
	for i := range n {
		r.forward(u, fmt.Sprintf("Host%d.Folding.Example.", i))
	}
	if failed := r.wait(t, 5*time.Second); len(failed) > 0 {
		t.Fatalf("%d of %d queries to an upstream that folds case failed:\n%s", len(failed), n, strings.Join(failed, "\n"))
	}
	for i := range 4 {
		exchangeOK(t, u, fmt.Sprintf("After%d.Folding.Example.", i))
	}
	st := u.Stats()
	srv.mu.Lock()
	accepted := srv.accepted
	srv.mu.Unlock()
	if !st.PlainCase || st.CaseProbes != caseProbes || st.CaseFetches != 0 || accepted != 0 {
		t.Fatalf("%+v, %d TCP connections: want 0x20 off after %d probes and nothing fetched over TCP", st, accepted, caseProbes)
	}
}

// A spoofer who hit the ID and the port of a query to an upstream known to
// echo case, its reply in another case (and another address) ahead of the
// upstream's exact one: the forged reply is not taken, the query is fetched
// over TCP, where an off-path forger cannot inject, and gets the real
// answer, once.
func TestForgedCaseChangeToAnEchoingUpstreamIsFetched(t *testing.T) {
	const victim = "Victim.Example."
	srv := newTestServer(t, func(req *dns.Msg, tcp bool) []*dns.Msg {
		if tcp || !strings.EqualFold(req.Question[0].Name, victim) {
			return []*dns.Msg{answer(req)}
		}
		forged := answer(req)
		forged.Question[0].Name = flipCase(req.Question[0].Name)
		forged.Answer[0].(*dns.A).A = net.IPv4(203, 0, 113, 66)
		return []*dns.Msg{forged, answer(req)}
	})
	u := newUpstream(t, Config{Addr: srv.addr(), Timeout: time.Second})
	exchangeOK(t, u, "Known.Example.")
	r := newReplies(1)
	r.forward(u, victim)
	if failed := r.wait(t, 5*time.Second); len(failed) > 0 {
		t.Fatalf("the query met a forged reply in another case: %s", failed[0])
	}
	srv.mu.Lock()
	overTCP := srv.ports[0] // queries read over TCP
	srv.mu.Unlock()
	if st := u.Stats(); st.CaseFetches != 1 || overTCP != 1 || st.PlainCase {
		t.Fatalf("%+v, %d queries read over TCP: want the victim's one TCP fetch, 0x20 on", st, overTCP)
	}
}
