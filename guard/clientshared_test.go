package guard

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// sharedStep is one line of a timeline through a client table and a shared
// bucket: at offset at, addr asks for a token of both and expects want.
type sharedStep struct {
	at   time.Duration
	addr string
	want Verdict
}

// The two gates as one: the client's bucket is asked first and a client
// refused there never touches the shared bucket; a query the shared bucket
// refuses spends nothing of the client's own. One shard of 3 slots, so the
// timelines reach a new prefix's placement, eviction and the overflow bucket.
func TestAllowWithAt(t *testing.T) {
	const a, b, c, d, e = "127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"
	tests := []struct {
		name         string
		client       ClientLimiterConfig
		rate         float64 // the shared bucket's
		burst        int
		exempt       string
		steps        []sharedStep
		sharedLeft   float64 // tokens left in the shared bucket at the end
		clientLeft   string  // a prefix whose bucket is counted at the end
		clientTokens int     // how many tokens it holds then
		slots        int     // prefixes holding a slot before it is counted
		evictions    uint64  // buckets evicted before it is counted
	}{
		{"a refusal of the shared bucket costs the client nothing",
			ClientLimiterConfig{Rate: 1, Burst: 3, TableSize: 3}, 10, 5, "", []sharedStep{
				{0, b, Admitted}, {0, b, Admitted}, {0, b, Admitted}, {0, c, Admitted}, {0, c, Admitted}, // others empty the shared bucket
				{0, a, RefusedByShared}, {0, a, RefusedByShared}, {0, a, RefusedByShared}, {0, a, RefusedByShared},
				{300 * time.Millisecond, a, Admitted}, {300 * time.Millisecond, a, Admitted}, // 3 shared tokens back
				{300 * time.Millisecond, a, Admitted},
				{300 * time.Millisecond, a, RefusedByClient}, // its own 3 spent on answers, none on refusals
			}, 0, a, 0, 3, 0},
		{"a client refused by its own bucket leaves the shared tokens",
			ClientLimiterConfig{Rate: 1, Burst: 1, TableSize: 3}, 1, 3, "", []sharedStep{
				{0, a, Admitted}, {0, a, RefusedByClient}, {0, a, RefusedByClient}, {0, a, RefusedByClient},
			}, 2, a, 0, 1, 0},
		{"a new prefix the shared bucket refuses takes no slot",
			ClientLimiterConfig{Rate: 1, Burst: 2, TableSize: 3}, 1, 1, "", []sharedStep{
				{0, a, Admitted}, {0, b, RefusedByShared},
			}, 0, b, 2, 1, 0},
		{"an eviction for a prefix the shared bucket refuses",
			ClientLimiterConfig{Rate: 1, Burst: 1, TableSize: 3}, 1, 3, "", []sharedStep{
				{0, a, Admitted}, {0, b, Admitted}, {0, c, Admitted}, // shared empty; a, b, c full at 1 s
				{time.Second, d, Admitted},        // the shared token of 1 s; evicts a
				{time.Second, e, RefusedByShared}, // evicts nothing; its bucket, when it has one, starts full
			}, 0, e, 1, 3, 1},
		{"the overflow bucket keeps its token when the shared one refuses",
			ClientLimiterConfig{Rate: 0.1, Burst: 1, TableSize: 3}, 1, 3, "", []sharedStep{
				{0, a, Admitted}, {0, b, Admitted}, {0, c, Admitted}, // busy for 10 s, shared empty
				{500 * time.Millisecond, d, RefusedByShared}, // no room: the overflow bucket, untouched
				{time.Second, d, Admitted},                   // its one token, still there
				{2 * time.Second, e, RefusedByClient},        // the overflow bucket is spent: the shared token stays
			}, 1, "", 0, 3, 0},
		{"an exempt client pays the shared bucket only",
			ClientLimiterConfig{Rate: 1, Burst: 1, TableSize: 3}, 1, 2, a, []sharedStep{
				{0, a, Admitted}, {0, a, Admitted}, {0, a, RefusedByShared},
			}, 0, "", 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.client
			if tt.exempt != "" {
				cfg.Exempt = []netip.Prefix{netip.MustParsePrefix(tt.exempt + "/32")}
			}
			l, clock := newTestClientLimiter(t, cfg, 1)
			shared := NewTokenBucket(tt.rate, tt.burst, clock)
			for i, s := range tt.steps {
				clock.Set(t0.Add(s.at))
				if got := l.AllowWithAt(t0.Add(s.at), netip.MustParseAddr(s.addr), shared); got != s.want {
					t.Fatalf("step %d (at %v, %s): %v, want %v", i, s.at, s.addr, got, s.want)
				}
			}
			if got := shared.Tokens(); got != tt.sharedLeft {
				t.Errorf("shared bucket holds %v, want %v", got, tt.sharedLeft)
			}
			if got := l.Len(); got != tt.slots {
				t.Errorf("Len = %d, want %d", got, tt.slots)
			}
			if got := l.Evictions(); got != tt.evictions {
				t.Errorf("Evictions = %d, want %d", got, tt.evictions)
			}
			if tt.clientLeft != "" {
				n := 0
				for l.AllowAt(clock.Now(), netip.MustParseAddr(tt.clientLeft)) && n < 100 {
					n++
				}
				if n != tt.clientTokens {
					t.Errorf("%s's bucket holds %d tokens, want %d", tt.clientLeft, n, tt.clientTokens)
				}
			}
		})
	}
}

// With no shared bucket AllowWithAt is AllowAt: admitted or refused by the
// client's bucket.
func TestAllowWithAtNoShared(t *testing.T) {
	l, _ := newTestClientLimiter(t, ClientLimiterConfig{Rate: 1, Burst: 2}, 1)
	addr := netip.MustParseAddr("127.0.0.1")
	for i, want := range []Verdict{Admitted, Admitted, RefusedByClient} {
		if got := l.AllowWithAt(t0, addr, nil); got != want {
			t.Fatalf("ask %d: %v, want %v", i, got, want)
		}
	}
}

// Many goroutines asking at one instant for one prefix, or for prefixes
// that share the overflow bucket: exactly the smaller burst is admitted,
// and whatever the interleaving the other gate loses nothing. A shared
// token taken for a query its client's bucket then refused (another
// goroutine took the client's last token in between) is given back, and a
// client's token is never spent for a query the shared bucket refused.
func TestAllowWithAtConcurrent(t *testing.T) {
	const goroutines, asks = 8, 500
	tests := []struct {
		name                      string
		clientBurst, sharedBurst  int
		tableSize                 int
		prefixes                  int
		wantAdmitted              int
		wantClientRefusalsAtLeast int
	}{
		{"the client's bucket is the smaller", 50, 1000, 100_000, 1, 50, 1},
		{"the shared bucket is the smaller", 1000, 50, 100_000, 1, 50, 0},
		{"prefixes in the overflow bucket", 50, 1000, 8, 64, 0, 1}, // counted below
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := NewManualClock(t0) // never moves: no token comes back
			l := NewClientLimiter(ClientLimiterConfig{Rate: 1, Burst: tt.clientBurst, TableSize: tt.tableSize}, clock)
			shared := NewTokenBucket(1, tt.sharedBurst, clock)
			addrs := make([]netip.Addr, tt.prefixes)
			for i := range addrs {
				addrs[i] = netip.AddrFrom4([4]byte{127, 1, byte(i >> 8), byte(i)})
			}
			var admitted, byClient, byShared atomic.Int64
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range asks {
						switch l.AllowWithAt(t0, addrs[(i+g)%len(addrs)], shared) {
						case Admitted:
							admitted.Add(1)
						case RefusedByClient:
							byClient.Add(1)
						case RefusedByShared:
							byShared.Add(1)
						}
					}
				}()
			}
			waitGroupWithin(t, &wg, time.Minute)
			if got := admitted.Load() + byClient.Load() + byShared.Load(); got != goroutines*asks {
				t.Fatalf("%d verdicts, want %d", got, goroutines*asks)
			}
			// Every admitted query took one shared token, and no other query kept one.
			if got, want := shared.Tokens(), float64(tt.sharedBurst)-float64(admitted.Load()); got != want {
				t.Errorf("shared bucket holds %v after %d admitted, want %v: tokens lost to client refusals", got, admitted.Load(), want)
			}
			if tt.prefixes == 1 {
				if admitted.Load() != int64(tt.wantAdmitted) {
					t.Errorf("admitted %d, want %d", admitted.Load(), tt.wantAdmitted)
				}
				// Every token the client's bucket did not spend on an admitted query is still there.
				n := 0
				for l.AllowAt(t0, addrs[0]) && n <= tt.clientBurst {
					n++
				}
				if want := tt.clientBurst - tt.wantAdmitted; n != want {
					t.Errorf("the client's bucket holds %d tokens, want %d: spent on refused queries", n, want)
				}
			} else if admitted.Load() > int64(l.Len()*tt.clientBurst+tt.clientBurst) {
				t.Errorf("admitted %d, more than %d slots and the overflow bucket hold", admitted.Load(), l.Len())
			}
			if byClient.Load() < int64(tt.wantClientRefusalsAtLeast) {
				t.Errorf("refused by the client's bucket %d times, want at least %d", byClient.Load(), tt.wantClientRefusalsAtLeast)
			}
		})
	}
}

// The verdicts' names, as logs and test failures print them.
func TestVerdictString(t *testing.T) {
	for v, want := range map[Verdict]string{Admitted: "admitted", RefusedByClient: "refused by the client's bucket",
		RefusedByShared: "refused by the shared bucket", Verdict(9): fmt.Sprintf("Verdict(%d)", 9)} {
		if got := v.String(); got != want {
			t.Errorf("%d: %q, want %q", int(v), got, want)
		}
	}
}

// The race the give-back exists for, made often: in each of many rounds,
// goroutines released together ask for one prefix whose bucket holds fewer
// tokens than they ask for, so several read its last token and take a
// shared token for it, and all but one must give theirs back.
func TestAllowWithAtLastTokenRace(t *testing.T) {
	const rounds, goroutines, clientBurst, sharedBurst = 300, 8, 3, 100
	addr := netip.MustParseAddr("127.0.0.1")
	for round := range rounds {
		clock := NewManualClock(t0)
		l := NewClientLimiter(ClientLimiterConfig{Rate: 1, Burst: clientBurst}, clock)
		shared := NewTokenBucket(1, sharedBurst, clock)
		l.AllowAt(t0, addr) // the prefix holds a slot: every goroutine takes the lock-free path
		var admitted atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if l.AllowWithAt(t0, addr, shared) == Admitted {
					admitted.Add(1)
				}
			}()
		}
		close(start)
		waitGroupWithin(t, &wg, 10*time.Second)
		if admitted.Load() != clientBurst-1 {
			t.Fatalf("round %d: %d admitted, want %d", round, admitted.Load(), clientBurst-1)
		}
		if got, want := shared.Tokens(), float64(sharedBurst-clientBurst+1); got != want {
			t.Fatalf("round %d: the shared bucket holds %v, want %v: a token taken for a refused query was kept", round, got, want)
		}
	}
}
