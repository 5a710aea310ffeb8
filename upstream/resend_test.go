package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// oneAnswerTCP is a TCP upstream shedding load the way RFC 7766 lets it:
// on each connection it answers the first query it reads, reads on without
// answering until it has read nothing for quiet, and closes. It counts the
// queries it reads and the connections it accepts.
type oneAnswerTCP struct {
	*hostilePair
	seen, conns atomic.Int64
}

func newOneAnswerTCP(t *testing.T, quiet time.Duration) *oneAnswerTCP {
	t.Helper()
	s := &oneAnswerTCP{}
	s.hostilePair = newHostilePair(t, func([]byte) [][]byte { return nil }, func(c *net.TCPConn) {
		defer c.Close()
		s.conns.Add(1)
		for i := 0; i < 10000; i++ { // bounded: a connection carries far fewer
			req, err := readFrame(c, quiet)
			if err != nil {
				return
			}
			s.seen.Add(1)
			if i == 0 {
				writeAnswer(t, c, req)
			}
		}
	})
	return s
}

// outcomes collects the outcome of n queries, each reported exactly once.
type outcomes struct {
	mu      sync.Mutex
	errs    map[string]error
	reports map[string]int
	all     chan struct{} // closed at the n-th first report
	n       int
}

func newOutcomes(n int) *outcomes {
	return &outcomes{errs: map[string]error{}, reports: map[string]int{}, all: make(chan struct{}), n: n}
}

// result is the Result of the query for name.
func (o *outcomes) result(name string) Result {
	return func(_, _ []byte, err error) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.reports[name]++
		if o.reports[name] == 1 {
			o.errs[name] = err
			if len(o.errs) == o.n {
				close(o.all)
			}
		}
	}
}

// wait waits for every query's report, within d, and fails the test for a
// query reported twice.
func (o *outcomes) wait(t *testing.T, d time.Duration) map[string]error {
	t.Helper()
	select {
	case <-o.all:
	case <-time.After(d):
		o.mu.Lock()
		defer o.mu.Unlock()
		t.Fatalf("%d of %d queries reported within %v", len(o.errs), o.n, d)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for name, k := range o.reports {
		if k != 1 {
			t.Errorf("%s reported %d times", name, k)
		}
	}
	return o.errs
}

// Against an upstream that answers one query per connection and closes,
// each query left on a failed connection went out again on a new one, as
// long as connections kept answering something: n pipelined queries cost
// the upstream n(n+1)/2 (20: 210). A query goes out at most maxSends
// times (extra.go), so the upstream reads at most maxSends*n, and every
// query is reported exactly once all the same.
func TestTCPResendsPerQueryAreBounded(t *testing.T) {
	const n = 20
	srv := newOneAnswerTCP(t, 30*time.Millisecond)
	u := newUpstream(t, Config{Addr: srv.addr(), Timeout: 5 * time.Second})
	o := newOutcomes(n)
	for i := range n {
		name := fmt.Sprintf("n%d.example.", i)
		b, _ := q(name).Pack()
		u.Forward(b, "tcp", o.result(name))
	}
	errs := o.wait(t, 10*time.Second)
	answered := 0
	for _, err := range errs {
		if err == nil {
			answered++
		}
	}
	t.Logf("%d of %d answered; the upstream read %d queries on %d connections", answered, n, srv.seen.Load(), srv.conns.Load())
	if got := srv.seen.Load(); got > maxSends*n {
		t.Errorf("the upstream read %d queries for %d sent: more than %d sends a query", got, n, maxSends)
	}
	if answered < maxSends {
		t.Errorf("%d answered, want %d at least: one a connection, and a query goes out on %d", answered, maxSends, maxSends)
	}
}

// hook is a Config.AllowExtra that answers allow and counts what it was asked.
type hook struct {
	allow atomic.Bool
	asked atomic.Int64
}

func newHook(allow bool) *hook {
	h := &hook{}
	h.allow.Store(allow)
	return h
}

func (h *hook) allowExtra() bool {
	h.asked.Add(1)
	return h.allow.Load()
}

// Every query the upstream sends again on a new TCP connection asks
// Config.AllowExtra first: refused, it is not sent and ends with
// ErrLimited, a query never sent (NotSent, Uncounted by the breaker);
// allowed, the upstream reads no query that was not paid for.
func TestTCPResendsAskAllowExtra(t *testing.T) {
	const n = 10
	for _, allow := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow %v", allow), func(t *testing.T) {
			srv := newOneAnswerTCP(t, 30*time.Millisecond)
			h := newHook(allow)
			u := newUpstream(t, Config{Addr: srv.addr(), Timeout: 5 * time.Second, AllowExtra: h.allowExtra})
			o := newOutcomes(n)
			for i := range n {
				name := fmt.Sprintf("n%d.example.", i)
				b, _ := q(name).Pack()
				u.Forward(b, "tcp", o.result(name))
			}
			errs := o.wait(t, 10*time.Second)
			answered, limited := 0, 0
			for name, err := range errs {
				switch {
				case err == nil:
					answered++
				case errors.Is(err, ErrLimited):
					limited++
					if !NotSent(err) || Judge(nil, err) != Uncounted {
						t.Errorf("%s: %v is not a query never sent", name, err)
					}
				}
			}
			seen, asked := srv.seen.Load(), h.asked.Load()
			t.Logf("%d answered, %d limited; the upstream read %d, AllowExtra asked %d times", answered, limited, seen, asked)
			if seen > n+asked || asked == 0 {
				t.Errorf("the upstream read %d queries: %d sent and %d extra paid for", seen, n, asked)
			}
			if !allow && (seen != n || answered != 1 || limited != n-1) {
				t.Errorf("with every extra send refused: %d read, %d answered, %d limited; want %d, 1, %d", seen, answered, limited, n, n-1)
			}
		})
	}
}

// The fetch over TCP of a UDP reply too large to read pays AllowExtra:
// refused, the query ends with ErrLimited and no connection is opened.
func TestOversizedFetchAsksAllowExtra(t *testing.T) {
	for _, allow := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow %v", allow), func(t *testing.T) {
			srv := newTestServer(t, func(req *dns.Msg, tcp bool) []*dns.Msg {
				m := answer(req)
				for i := range 40 {
					rr, _ := dns.NewRR(fmt.Sprintf("%s 60 IN TXT \"%02d %s\"", req.Question[0].Name, i, strings.Repeat("x", 240)))
					m.Answer = append(m.Answer, rr)
				}
				return []*dns.Msg{m}
			})
			h := newHook(allow)
			u := newUpstream(t, Config{Addr: srv.addr(), AllowExtra: h.allowExtra})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := u.Exchange(ctx, q("big.example."), "udp")
			srv.mu.Lock()
			accepted := srv.accepted
			srv.mu.Unlock()
			want := error(nil)
			if !allow {
				want = ErrLimited
			}
			if !errors.Is(err, want) || (err == nil) != allow || h.asked.Load() != 1 || accepted != btoi(allow) {
				t.Errorf("ended with %v after %d TCP connections, AllowExtra asked %d times; want %v, %d connection, 1 asked", err, accepted, h.asked.Load(), want, btoi(allow))
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// A query forwarded once, over UDP or TCP, is the caller's send, paid by
// the caller: AllowExtra is not asked.
func TestFirstSendDoesNotAskAllowExtra(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg { return []*dns.Msg{answer(req)} })
	h := newHook(false)
	u := newUpstream(t, Config{Addr: srv.addr(), AllowExtra: h.allowExtra})
	for _, network := range []string{"udp", "tcp"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := u.Exchange(ctx, q("a.example."), network)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", network, err)
		}
	}
	if n := h.asked.Load(); n != 0 {
		t.Fatalf("AllowExtra asked %d times for two first sends", n)
	}
}

// An upstream that does not echo case costs probes and a re-send in the
// caller's case, each paid through AllowExtra: the upstream reads the
// query and exactly what was paid for. While AllowExtra refuses, no probe
// goes out and the query ends at its deadline; a refused probe ends its
// series, so once AllowExtra allows again the next query's series runs and
// 0x20 is switched off.
func TestCaseProbesAndResendsAskAllowExtra(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg {
		m := answer(req)
		m.Question[0].Name = strings.ToLower(req.Question[0].Name)
		return []*dns.Msg{m}
	})
	h := newHook(false)
	u := newUpstream(t, Config{Addr: srv.addr(), Timeout: 500 * time.Millisecond, AllowExtra: h.allowExtra})
	const name = "Mixed.Example.COM."
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := u.Exchange(ctx, q(name), "udp")
	cancel()
	srv.mu.Lock()
	seen := len(srv.names)
	srv.mu.Unlock()
	if !errors.Is(err, ErrTimeout) || seen != 1 || u.Stats().CaseProbes != 0 || h.asked.Load() != 1 {
		t.Fatalf("with AllowExtra refusing: %v, the upstream read %d, %+v, asked %d; want a timeout, 1 read, no probe, asked once",
			err, seen, u.Stats(), h.asked.Load())
	}

	h.allow.Store(true)
	h.asked.Store(0)
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	r, err := u.Exchange(ctx, q(name), "udp")
	cancel()
	if err != nil || r.Question[0].Name != name {
		t.Fatalf("once AllowExtra allows: %v, want the answer after the fallback", err)
	}
	st := u.Stats()
	srv.mu.Lock()
	seen = len(srv.names) - seen
	srv.mu.Unlock()
	if !st.PlainCase || h.asked.Load() != int64(st.CaseProbes+st.CaseResends) || seen != 1+int(h.asked.Load()) {
		t.Fatalf("%+v, AllowExtra asked %d, the upstream read %d: want 0x20 off, every probe and re-send asked for, and nothing else read",
			st, h.asked.Load(), seen)
	}
}
