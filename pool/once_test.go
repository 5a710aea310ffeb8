package pool

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
)

// Exactly once, whatever happens: thousands of queries from several
// goroutines, each attempt answered at once or later (from other
// goroutines) with an answer, SERVFAIL, a network error, a timeout or
// shutdown, while the clock moves and hedges fire. Every query is reported
// exactly once, with its own query; every attempt is reported to its
// breaker (the Observer beside it) exactly once; no query makes more than
// two attempts.
func TestExactlyOnceWithRetriesAndHedges(t *testing.T) {
	clock := guard.NewManualClock(t0)
	obs := &counter{}
	var rngMu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(choices ...outcome) outcome {
		rngMu.Lock()
		defer rngMu.Unlock()
		return choices[rng.IntN(len(choices))]
	}
	var ups []*fakeUpstream
	cfg := Config{Policy: RoundRobin, Timeout: 30 * time.Second, Hedge: 50 * time.Millisecond,
		Budget: guard.NewRetryBudget(guard.RetryBudgetConfig{Ratio: 1, MinPerSecond: 1000}, clock), Observer: obs, Clock: clock}
	for i := range 3 {
		up := &fakeUpstream{member: i, decide: func([]byte) outcome { return pick(hold, hold, good, servfail, netErr, closed) }}
		ups = append(ups, up)
		b := guard.NewBreaker(guard.BreakerConfig{Window: 1000, MinSamples: 1000, FailThreshold: 1, CoolOff: time.Hour}, clock)
		cfg.Members = append(cfg.Members, Member{Name: fmt.Sprint(i), Upstream: up, Breaker: b})
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	// Held attempts end later, on two goroutines of their own.
	stop := make(chan struct{})
	var helpers sync.WaitGroup
	for range 2 {
		helpers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, up := range ups {
					for _, s := range up.takeHeld() {
						finish(s, pick(good, servfail, refused, netErr, timeout, closed))
					}
				}
				time.Sleep(100 * time.Microsecond)
			}
		})
	}
	helpers.Go(func() { // the clock moves: hedges come due while queries are sent and answered
		for {
			select {
			case <-stop:
				return
			default:
			}
			clock.Advance(10 * time.Millisecond)
			time.Sleep(200 * time.Microsecond)
		}
	})

	const clients, perClient = 4, 500
	queries := make([][]asked, clients)
	var senders sync.WaitGroup
	for c := range clients {
		senders.Go(func() {
			for i := range perClient {
				name := fmt.Sprintf("q%d-%d.example.", c, i)
				m := new(dns.Msg)
				m.SetQuestion(name, dns.TypeA)
				b, _ := m.Pack()
				ch := make(chan result, 2)
				x, err := p.Acquire()
				if err != nil {
					t.Error(err)
					return
				}
				x.Forward(b, "udp", func(query, reply []byte, err error) {
					ch <- result{append([]byte(nil), query...), append([]byte(nil), reply...), err}
				})
				queries[c] = append(queries[c], asked{name, ch})
			}
		})
	}
	senders.Wait()
	close(stop)
	helpers.Wait()
	// Whatever is still held ends now; a retry or hedge it sets off is
	// held in turn, so drain until nothing is left.
	clock.Advance(time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := 0
		for _, up := range ups {
			for _, s := range up.takeHeld() {
				finish(s, good)
				n++
			}
		}
		if n == 0 && reportedAll(queries) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("queries still unreported after 10s")
		}
		time.Sleep(time.Millisecond)
	}

	attemptsOf := map[string]int{}
	total := 0
	for _, up := range ups {
		for _, s := range up.all() {
			m := new(dns.Msg)
			if err := m.Unpack(s.query); err != nil {
				t.Fatal(err)
			}
			attemptsOf[m.Question[0].Name]++
			total++
		}
	}
	for _, qs := range queries {
		for _, q := range qs {
			res := <-q.ch
			none(t, q.ch, q.name)
			m := new(dns.Msg)
			if err := m.Unpack(res.query); err != nil || m.Question[0].Name != q.name {
				t.Fatalf("%s was reported with another query (%v)", q.name, err)
			}
			if n := attemptsOf[q.name]; n < 1 || n > maxAttempts {
				t.Fatalf("%s made %d attempts", q.name, n)
			}
		}
	}
	if got := obs.attempts.Load(); got != int64(total) {
		t.Fatalf("%d attempts sent, %d reported to their breakers", total, got)
	}
	hedges, retries := obs.retries[RetryHedge].Load(), obs.retries[RetryFailure].Load()+obs.retries[RetryAnswer].Load()
	if obs.retries[RetryFailure].Load() == 0 || obs.retries[RetryAnswer].Load() == 0 {
		t.Fatalf("the mix did not exercise every path: %d hedges, %d retries after failures, %d after answers",
			hedges, obs.retries[RetryFailure].Load(), obs.retries[RetryAnswer].Load())
	}
	if hedges == 0 {
		// Whether a hedge comes due depends on the scheduler (a query must
		// still be held when the clock passes its hedge time): on a loaded
		// machine none may. The checks above then covered retries alone;
		// TestHedgeAndTheLateAnswer and the two after it cover hedges
		// deterministically.
		t.Logf("no hedge came due in this run (%d retries)", retries)
	}
	if int64(total) != clients*perClient+hedges+retries {
		t.Fatalf("%d attempts for %d queries, %d hedges and %d retries", total, clients*perClient, hedges, retries)
	}
	t.Logf("%d queries, %d attempts: %d hedges, %d retries", clients*perClient, total, hedges, retries)
}

// asked is one query of the test and where its report arrives.
type asked struct {
	name string
	ch   chan result
}

// reportedAll reports whether every query has its report.
func reportedAll(queries [][]asked) bool {
	for _, qs := range queries {
		for _, q := range qs {
			if len(q.ch) == 0 {
				return false
			}
		}
	}
	return true
}
