package fleet

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestLeaseScriptGrants walks the script through a table of asks on a bucket
// that refills too slowly to matter: it grants what it holds, no more.
func TestLeaseScriptGrants(t *testing.T) {
	r := startRedis(t)
	c := r.client()
	keys := fleetKeys("grants")
	const rate, burst = 0.001, 100 // a token every 1000 s: none earned during the test
	steps := []struct {
		name          string
		want, granted int64
	}{
		{"the bucket starts full", 30, 30},
		{"again", 30, 30},
		{"more than is left", 50, 40},
		{"empty", 1, 0},
		{"membership only", 0, 0},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			got, err := callLease(ctx, c, keys, rate, burst, s.want, "a", settlement{}, false)
			if err != nil {
				t.Fatal(err)
			}
			if got.granted != s.granted || got.instances != 1 {
				t.Errorf("want %d: got %+v, want granted %d of 1 instance", s.want, got, s.granted)
			}
		})
	}
}

// TestLeaseScriptDividesTheBucket: with several instances counted, one call
// takes at most the bucket ÷ the instances, so a starved fleet shares fairly.
func TestLeaseScriptDividesTheBucket(t *testing.T) {
	r := startRedis(t)
	c := r.client()
	keys := fleetKeys("divides")
	const rate, burst = 0.001, 100
	steps := []struct {
		member        string
		want, granted int64
	}{
		{"a", 0, 0},   // a joins: 100 held
		{"b", 80, 50}, // 100 ÷ 2
		{"a", 80, 25}, // 50 ÷ 2
		{"b", 80, 12}, // 25 ÷ 2, rounded down
		{"a", 80, 6},  // 13 ÷ 2
		{"b", 80, 3},  // 7 ÷ 2
		{"a", 80, 2},  // 4 ÷ 2
		{"b", 80, 1},  // 2 ÷ 2
		{"a", 80, 1},  // 1 held: at least one while a whole token is
		{"b", 80, 0},  // none left
	}
	for i, s := range steps {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		got, err := callLease(ctx, c, keys, rate, burst, s.want, s.member, settlement{}, false)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if got.granted != s.granted {
			t.Errorf("step %d: %s asked %d, granted %d, want %d", i, s.member, s.want, got.granted, s.granted)
		}
	}
}

// TestLeaseScriptConcurrentCallers: callers on their own connections ask far
// more than the bucket refills; the script's grants, summed, never exceed
// burst + rate × (Redis's time from before the first call to after the last).
func TestLeaseScriptConcurrentCallers(t *testing.T) {
	r := startRedis(t)
	check := r.client()
	keys := fleetKeys("concurrent")
	const rate, burst, callers, calls = 200.0, 50, 8, 100
	start := redisTime(t, check)
	var wg sync.WaitGroup
	grants := make([]int64, callers)
	errs := make(chan error, callers)
	for i := range callers {
		c := r.client()
		wg.Go(func() {
			for range calls {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				got, err := callLease(ctx, c, keys, rate, burst, rand.Int64N(20)+1, strconv.Itoa(i), settlement{}, false)
				cancel()
				if err != nil {
					errs <- err
					return
				}
				grants[i] += got.granted
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	end := redisTime(t, check)
	var total int64
	for _, g := range grants {
		total += g
	}
	bound := burst + rate*end.Sub(start).Seconds()
	t.Logf("%d callers × %d calls granted %d over %v of Redis time; bound %.1f", callers, calls, total, end.Sub(start), bound)
	if float64(total) > bound {
		t.Errorf("granted %d tokens, more than the bucket can hold and earn: %.1f", total, bound)
	}
	if total < burst {
		t.Errorf("granted %d tokens, less than the full bucket it started as (%d): callers asked far more", total, burst)
	}
}

// TestLeaseScriptMembership: instances count themselves in; an expired
// member is dropped by the next call.
func TestLeaseScriptMembership(t *testing.T) {
	r := startRedis(t)
	c := r.client()
	keys := fleetKeys("members")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease := func(member string) int {
		t.Helper()
		got, err := callLease(ctx, c, keys, 100, 100, 0, member, settlement{}, false)
		if err != nil {
			t.Fatal(err)
		}
		return got.instances
	}
	steps := []struct {
		name   string
		member string
		want   int
	}{
		{"first", "a", 1},
		{"second", "b", 2},
		{"first again", "a", 2},
		{"third", "c", 3},
	}
	for _, s := range steps {
		if got := lease(s.member); got != s.want {
			t.Fatalf("%s: %d instances, want %d", s.name, got, s.want)
		}
	}
	// A member whose expiry passed (scored one second ago on Redis's clock).
	past := redisTime(t, c).Add(-time.Second).UnixMicro()
	if err := c.ZAdd(ctx, keys[1], redis.Z{Score: float64(past), Member: "gone"}).Err(); err != nil {
		t.Fatal(err)
	}
	if got := lease("a"); got != 3 {
		t.Errorf("with an expired member: %d instances, want 3", got)
	}
	if n, err := c.ZScore(ctx, keys[1], "gone").Result(); err == nil {
		t.Errorf("the expired member is still there, scored %v", n)
	}
}

// TestLeaseScriptKeys: the script touches only its three keys, all under
// one hash tag, and each expires on its own.
func TestLeaseScriptKeys(t *testing.T) {
	r := startRedis(t)
	c := r.client()
	keys := callKeys("tagged", "a")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := callLease(ctx, c, keys, 10, 10, 5, "a", settlement{debt: 1, debtTotal: 1}, false); err != nil {
		t.Fatal(err)
	}
	all, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(all)
	if want := []string{"{tagged}:bucket", "{tagged}:ledger:a", "{tagged}:members"}; !slices.Equal(all, want) {
		t.Fatalf("keys %q, want %q", all, want)
	}
	for _, k := range all {
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil || ttl <= 0 {
			t.Errorf("key %s: expiry %v (%v), want one set", k, ttl, err)
		}
	}
}

// TestLeaseScriptClockBack: a bucket stamped later than Redis's clock (a
// failover to a server whose clock is behind) is not stalled until the
// clock catches up: the stamp moves back to now and refilling goes on.
func TestLeaseScriptClockBack(t *testing.T) {
	r := startRedis(t)
	c := r.client()
	keys := fleetKeys("clockback")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	future := redisTime(t, c).Add(time.Hour).UnixMicro()
	if err := c.HSet(ctx, keys[0], "tokens", "0", "ts", strconv.FormatInt(future, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	if got, err := callLease(ctx, c, keys, 1000, 1000, 1, "a", settlement{}, false); err != nil || got.granted != 0 {
		t.Fatalf("first call after the step back: %+v, %v; want nothing granted, nothing earned", got, err)
	}
	stamp, err := c.HGet(ctx, keys[0], "ts").Int64()
	if err != nil {
		t.Fatal(err)
	}
	if now := redisTime(t, c).UnixMicro(); stamp > now {
		t.Fatalf("the bucket is still stamped %d µs ahead of Redis's clock", stamp-now)
	}
}

// TestLeaseScriptDebt: a call's debt (tokens spent locally while Redis
// could not be reached) comes off the bucket before anything is granted,
// never below empty. At a rate of 1 a second nothing refills meanwhile.
func TestLeaseScriptDebt(t *testing.T) {
	r := startRedis(t)
	c := r.client()
	keys := fleetKeys("debt")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	steps := []struct {
		want, debt, granted int64
	}{
		{want: 30, debt: 60, granted: 30}, // a full bucket of 100: 40 left after the debt, 30 granted
		{want: 30, debt: 0, granted: 10},  // what is left
		{want: 5, debt: 1000, granted: 0}, // empty, and not below: a debt larger than the bucket is not carried
	}
	for i, s := range steps {
		got, err := callLease(ctx, c, keys, 1, 100, s.want, "a", settlement{debt: s.debt}, false)
		if err != nil || got.granted != s.granted {
			t.Fatalf("step %d (want %d, debt %d): %+v, %v; want %d granted", i, s.want, s.debt, got, err, s.granted)
		}
	}
	if tokens, err := c.HGet(ctx, keys[0], "tokens").Float64(); err != nil || tokens < 0 || tokens > 1 {
		t.Fatalf("bucket holds %v (%v) after a debt larger than it, want empty, not below", tokens, err)
	}
}

// TestLeaseScriptReturned: returned tokens go back into the bucket before
// anything is granted, never above the burst, after the debt. At a rate of
// 1 a second nothing refills meanwhile.
func TestLeaseScriptReturned(t *testing.T) {
	r := startRedis(t)
	c := r.client()
	keys := fleetKeys("returned")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	steps := []struct {
		want, debt, returned, granted int64
	}{
		{want: 100, granted: 100},                    // a full bucket of 100, emptied
		{want: 5, returned: 3, granted: 3},           // three back, three out again
		{want: 50, returned: 40, granted: 40},        // forty back
		{want: 0, returned: 500},                     // a full bucket is not overfilled
		{want: 200, granted: 100},                    // the burst, not 540
		{want: 10, debt: 5, returned: 5, granted: 5}, // the debt first (nothing to take), then the return
	}
	for i, s := range steps {
		got, err := callLease(ctx, c, keys, 1, 100, s.want, "a", settlement{debt: s.debt, returned: s.returned}, false)
		if err != nil || got.granted != s.granted {
			t.Fatalf("step %d (want %d, debt %d, returned %d): %+v, %v; want %d granted", i, s.want, s.debt, s.returned, got, err, s.granted)
		}
	}
}

// TestLeaseScriptLedger: with its ledger key, a call settles only the part
// of its debt and return that the instance's earlier calls that ran have
// not: a call carrying again what a call whose answer was lost carried
// settles it once, and a late copy of an earlier call settles nothing. A
// ledger gone (expired) takes what the call carries. At a rate of 1 a
// second the bucket refills less than a token meanwhile.
func TestLeaseScriptLedger(t *testing.T) {
	r := startRedis(t)
	c := r.client()
	keys := callKeys("ledger", "a")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	steps := []struct {
		name    string
		st      settlement
		want    int64
		forget  bool    // the ledger expires before this call
		granted int64   // want, here
		left    float64 // tokens in the bucket after the call
	}{
		{name: "a full bucket, a debt of 10, 10 granted", st: settlement{debt: 10, debtTotal: 10}, want: 10, granted: 10, left: 980},
		{name: "its answer lost: the same debt again and 20 more", st: settlement{debt: 30, debtTotal: 30}, left: 960},
		{name: "a late copy of the first call", st: settlement{debt: 10, debtTotal: 10}, left: 960},
		{name: "10 given back", st: settlement{returned: 10, debtTotal: 30, returnedTotal: 10}, left: 970},
		{name: "its answer lost: the same 10 again and 5 more", st: settlement{returned: 15, debtTotal: 30, returnedTotal: 15}, left: 975},
		{name: "a ledger gone takes the call as it is", st: settlement{debt: 5, returned: 8, debtTotal: 35, returnedTotal: 23}, forget: true, left: 978},
		{name: "the next settles what is new", st: settlement{debt: 2, debtTotal: 37, returnedTotal: 23}, left: 976},
		{name: "a late copy of the call before", st: settlement{debt: 5, returned: 8, debtTotal: 35, returnedTotal: 23}, left: 976},
	}
	for i, s := range steps {
		if s.forget {
			if err := c.Del(ctx, keys[2]).Err(); err != nil {
				t.Fatal(err)
			}
		}
		got, err := callLease(ctx, c, keys, 1, 1000, s.want, "a", s.st, false)
		if err != nil || got.granted != s.granted {
			t.Fatalf("step %d (%s): %+v, %v; want %d granted", i, s.name, got, err, s.granted)
		}
		tokens, err := c.HGet(ctx, keys[0], "tokens").Float64()
		if err != nil || tokens < s.left || tokens > s.left+1 {
			t.Fatalf("step %d (%s): the bucket holds %v (%v), want %v", i, s.name, tokens, err, s.left)
		}
	}
	ttl, err := c.PTTL(ctx, keys[2]).Result()
	if err != nil || ttl <= 0 || ttl > ledgerLife {
		t.Fatalf("the ledger's expiry is %v (%v), want at most %v", ttl, err, ledgerLife)
	}
}
