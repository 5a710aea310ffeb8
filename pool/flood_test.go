package pool

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
	"dnsproxi/upstream"
)

// closingUpstream is a fake upstream that Pool.Close closes: the attempts
// it holds end with ErrClosed, as upstream.Upstream's do.
type closingUpstream struct{ *fakeUpstream }

func (c closingUpstream) Close() error {
	for _, s := range c.takeHeld() {
		finish(s, closed)
	}
	return nil
}

// chancyLimit is an outbound limit that refuses one token in six.
type chancyLimit struct{ n atomic.Int64 }

func (l *chancyLimit) Allow(int) bool { return l.n.Add(1)%6 != 0 }

// putBack returns attempts taken with takeHeld to be held again.
func (f *fakeUpstream) putBack(s []sent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.held = append(f.held, s...)
}

// No breaker is left wedged half-open, whatever a flood of queries does:
// breakers that trip on a few failures and cool off within the run, so
// that half-open probes are taken by first attempts, retries and hedges
// alike; attempts that answer, fail, time out, time out for a slow name,
// end with shutdown, or are held and ended later from another goroutine;
// an outbound limit and a budget that refuse some extra attempts. After
// each round, once every query is reported, a half-open breaker must have
// its probe's place free: a permit taken and never ended (nor cancelled)
// would keep it refusing until the lost-probe deadline. The last round
// ends with Pool.Close, its attempts ended by shutdown.
func TestNoBreakerWedgedByAFlood(t *testing.T) {
	for _, policy := range []Policy{Sequential, RoundRobin, Fastest} {
		t.Run(policy.String(), func(t *testing.T) { floodRounds(t, policy) })
	}
}

func floodRounds(t *testing.T, policy Policy) {
	const (
		coolOff              = time.Second
		rounds               = 12
		clients, perClient   = 3, 40
		step, stepsPerRound  = 10 * time.Millisecond, 30 // 300 ms a round: no probe of the round can be lost
		upstreams            = 3
		heldChance, outcomes = 3, 9
	)
	clock := guard.NewManualClock(t0)
	obs := &counter{}
	var rngMu sync.Mutex
	rng := rand.New(rand.NewPCG(3, uint64(policy)))
	intn := func(n int) int {
		rngMu.Lock()
		defer rngMu.Unlock()
		return rng.IntN(n)
	}
	end := func(s sent) {
		switch intn(outcomes) {
		case 0, 1, 2, 3:
			finish(s, good)
		case 4:
			finish(s, servfail)
		case 5:
			finish(s, netErr)
		case 6:
			finish(s, timeout)
		case 7:
			s.done(s.query, nil, upstream.ErrNameTimeout)
		default:
			finish(s, closed)
		}
	}
	var halfOpened, probesDecided atomic.Int64
	var ups []*fakeUpstream
	cfg := Config{Policy: policy, Timeout: 900 * time.Millisecond, Hedge: 20 * time.Millisecond,
		Budget:   guard.NewRetryBudget(guard.RetryBudgetConfig{Ratio: 0.5, MinPerSecond: 2}, clock),
		Observer: obs, Clock: clock, Outbound: &chancyLimit{}}
	for i := range upstreams {
		up := &fakeUpstream{member: i}
		up.decide = func([]byte) outcome {
			if intn(heldChance) == 0 {
				return [...]outcome{good, good, good, servfail, netErr, timeout, closed}[intn(7)]
			}
			return hold
		}
		ups = append(ups, up)
		b := guard.NewBreaker(guard.BreakerConfig{Window: 6, MinSamples: 3, FailThreshold: 0.5, CoolOff: coolOff}, clock)
		b.OnStateChange(func(from, to guard.State) {
			switch {
			case to == guard.HalfOpen:
				halfOpened.Add(1)
			case from == guard.HalfOpen:
				probesDecided.Add(1)
			}
		})
		cfg.Members = append(cfg.Members, Member{Name: fmt.Sprint(i), Upstream: closingUpstream{up}, Breaker: b})
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	closedPool := false
	defer func() {
		if !closedPool {
			p.Close()
		}
	}()

	for round := range rounds {
		last := round == rounds-1
		clock.Advance(coolOff) // the open breakers' cool-offs end: their next queries probe
		var queries []chan result
		var qmu sync.Mutex
		var senders, helpers sync.WaitGroup
		stop := make(chan struct{})
		for c := range clients {
			senders.Go(func() {
				for i := range perClient {
					m := new(dns.Msg)
					m.SetQuestion(fmt.Sprintf("r%d-c%d-q%d.example.", round, c, i), dns.TypeA)
					b, _ := m.Pack()
					x, err := p.Acquire()
					if err != nil {
						continue // every breaker refused, or the limit did: nothing taken
					}
					ch := make(chan result, 2)
					qmu.Lock()
					queries = append(queries, ch)
					qmu.Unlock()
					x.Forward(b, "udp", func(query, reply []byte, err error) {
						ch <- result{query, nil, err}
					})
				}
			})
		}
		helpers.Go(func() { // held attempts end later, from here
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, up := range ups {
					var kept []sent
					for _, s := range up.takeHeld() {
						if last || intn(4) != 0 {
							kept = append(kept, s) // later, or in the last round for Close
							continue
						}
						end(s)
					}
					up.putBack(kept)
				}
				time.Sleep(100 * time.Microsecond)
			}
		})
		helpers.Go(func() { // the clock moves: hedges come due, open breakers stay open
			for range stepsPerRound {
				select {
				case <-stop:
					return
				default:
				}
				clock.Advance(step)
				time.Sleep(100 * time.Microsecond)
			}
		})
		senders.Wait()
		close(stop)
		helpers.Wait()

		if last {
			closedPool = true
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
		}
		// Whatever is still held ends now; an extra attempt it sets off is
		// held in turn, so drain until every query is reported.
		deadline := time.Now().Add(10 * time.Second)
		for {
			n := 0
			for _, up := range ups {
				for _, s := range up.takeHeld() {
					end(s)
					n++
				}
			}
			all := true
			for _, ch := range queries {
				all = all && len(ch) > 0
			}
			if n == 0 && all {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: queries still unreported after 10s", round)
			}
			time.Sleep(time.Millisecond)
		}
		for _, ch := range queries {
			<-ch
			none(t, ch, fmt.Sprintf("round %d", round))
		}
		for i := range upstreams {
			b := p.Breaker(i)
			// An extra attempt refused or not sent gives its permit back
			// right after; give it a moment, then the probe's place must be free.
			waitUntil(t, fmt.Sprintf("round %d: upstream %d's breaker, %v, to have its probe's place free", round, i, b.State()), func() bool {
				if b.State() != guard.HalfOpen {
					return true
				}
				permit, err := b.Acquire()
				permit.Cancel()
				return err == nil
			})
		}
	}
	var sends int64
	for _, up := range ups {
		sends += int64(up.count())
	}
	if got := obs.attempts.Load(); got != sends {
		t.Fatalf("%d attempts sent, %d reported to their breakers", sends, got)
	}
	if halfOpened.Load() == 0 || probesDecided.Load() == 0 {
		t.Fatalf("the flood never exercised the probes: %d half-open transitions, %d probes decided", halfOpened.Load(), probesDecided.Load())
	}
	t.Logf("%d attempts, %d hedges, %d retries, %d budget refusals; %d half-open transitions, %d probes decided",
		sends, obs.retries[RetryHedge].Load(), obs.retries[RetryFailure].Load()+obs.retries[RetryAnswer].Load(),
		obs.refused.Load(), halfOpened.Load(), probesDecided.Load())
}
