package pool

import (
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
	"dnsproxi/upstream"
)

// BenchmarkChoose is what a query pays to choose its upstream among 4
// whose breakers are all closed, by each policy: the policy's start and
// the breakers' Acquire. The target is at most 100 ns and no allocation.
func BenchmarkChoose(b *testing.B) {
	for _, policy := range []Policy{Sequential, RoundRobin, Fastest} {
		p := benchPool(b, policy)
		b.Run(policy.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				i, permit, ok := p.choose(p.firstStart(), 0)
				if !ok || i < 0 {
					b.Fatal("refused")
				}
				permit.Success()
			}
		})
		b.Run(policy.String()+"-parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, _, ok := p.choose(p.firstStart(), 0); !ok {
						b.Fatal("refused")
					}
				}
			})
		})
	}
}

// The README's promise for choosing among 4 closed breakers, by each
// policy: no allocation. The benchmark above reports it; this fails if it
// stops being true.
func TestChooseAllocatesNothing(t *testing.T) {
	for _, policy := range []Policy{Sequential, RoundRobin, Fastest} {
		t.Run(policy.String(), func(t *testing.T) {
			p := benchPool(t, policy)
			allocs := testing.AllocsPerRun(1000, func() {
				_, permit, ok := p.choose(p.firstStart(), 0)
				if !ok {
					t.Fatal("refused")
				}
				permit.Success()
			})
			if allocs != 0 {
				t.Fatalf("%v allocations per choice, want 0", allocs)
			}
		})
	}
}

// BenchmarkAcquire is choosing plus taking an Exchange from the pool and
// giving it back: the forward gate's whole cost.
func BenchmarkAcquire(b *testing.B) {
	p := benchPool(b, Sequential)
	b.ReportAllocs()
	for b.Loop() {
		x, err := p.Acquire()
		if err != nil {
			b.Fatal(err)
		}
		x.recycle()
	}
}

func benchPool(b testing.TB, policy Policy) *Pool {
	b.Helper()
	cfg := Config{Policy: policy}
	for i := range 4 {
		br := guard.NewBreaker(guard.BreakerConfig{CoolOff: time.Second}, guard.RealClock{})
		cfg.Members = append(cfg.Members, Member{Name: string(rune('a' + i)), Upstream: &fakeUpstream{}, Breaker: br})
	}
	p, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for i := range p.members {
		p.members[i].srtt.Store(int64(i+1) * int64(time.Millisecond))
	}
	b.Cleanup(func() { p.Close() })
	return p
}

// cannedUpstream answers every query at once with the same reply.
type cannedUpstream struct{ reply []byte }

func (c cannedUpstream) ForwardUntil(query []byte, _ string, _ time.Time, done upstream.Result) {
	done(query, c.reply, nil)
}

// BenchmarkForward is a query's whole way through the pool when its first
// upstream answers at once: Acquire, Forward, the attempt's landing (its
// breaker, its smoothed time, the verdict) and the report.
func BenchmarkForward(b *testing.B) {
	m := new(dns.Msg)
	m.SetQuestion("bench.example.", dns.TypeA)
	query, _ := m.Pack()
	r := new(dns.Msg)
	r.SetReply(m)
	answer, _ := r.Pack()
	cfg := Config{Budget: guard.NewRetryBudget(*generous, nil)}
	for i := range 2 {
		br := guard.NewBreaker(guard.BreakerConfig{CoolOff: time.Second}, guard.RealClock{})
		cfg.Members = append(cfg.Members, Member{Name: string(rune('a' + i)), Upstream: cannedUpstream{answer}, Breaker: br})
	}
	p, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	done := func(_, reply []byte, err error) {
		if err != nil || len(reply) == 0 {
			b.Fatal("no answer")
		}
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			x, err := p.Acquire()
			if err != nil {
				b.Fatal(err)
			}
			x.Forward(query, "udp", done)
		}
	})
}
