package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"dnsproxi/dnsserver"
	"dnsproxi/exercises/fakeupstream"
	"dnsproxi/guard"
	"dnsproxi/metrics"
	"dnsproxi/pool"
	"dnsproxi/upstream"
)

// The late join (joinOrShare, step 5 of handleQuery) driven step by step:
// a query is held inside the pool's Acquire — its breaker permit taken,
// its place under the in-flight cap too — by an outbound limit that waits
// for the test, while an identical query goes all the way through.

// pausingOutbound is an outbound limit whose next call after arm waits,
// its caller inside Acquire, until the test releases it (or the test
// ends); every call is allowed unless refuse is set.
type pausingOutbound struct {
	calls   atomic.Int64
	pauseAt atomic.Int64
	refuse  atomic.Bool
	mu      sync.Mutex
	paused  chan struct{} // closed when the armed call waits
	gate    <-chan struct{}
	release func()
}

// arm makes the next call wait.
func (o *pausingOutbound) arm(t *testing.T) {
	gate, open := holdGate(t)
	o.mu.Lock()
	o.paused, o.gate, o.release = make(chan struct{}), gate, open
	o.mu.Unlock()
	o.pauseAt.Store(o.calls.Load() + 1)
}

func (o *pausingOutbound) Allow(int) bool {
	if o.calls.Add(1) == o.pauseAt.Load() {
		o.mu.Lock()
		paused, gate := o.paused, o.gate
		o.mu.Unlock()
		close(paused)
		<-gate // opened by the test, at the latest when it ends
	}
	return !o.refuse.Load()
}

// waitPaused waits for the armed call to wait, then returns what releases it.
func (o *pausingOutbound) waitPaused(t *testing.T) func() {
	t.Helper()
	o.mu.Lock()
	paused, release := o.paused, o.release
	o.mu.Unlock()
	within(t, "a query to pause inside Acquire", paused)
	return release
}

// heldForwarder is an upstream that keeps every query until the test ends
// them; it counts them as they come.
type heldForwarder struct {
	mu   sync.Mutex
	held []heldSend
	n    atomic.Int64
	nets []string
}

type heldSend struct {
	query   []byte
	network string
	done    upstream.Result
}

func (h *heldForwarder) Forward(query []byte, network string, done upstream.Result) {
	h.mu.Lock()
	h.held = append(h.held, heldSend{append([]byte(nil), query...), network, done})
	h.nets = append(h.nets, network)
	h.mu.Unlock()
	h.n.Add(1)
}

// end answers every query held with rcode (the zone's answer if NOERROR).
func (h *heldForwarder) end(rcode int) {
	h.mu.Lock()
	held := h.held
	h.held = nil
	h.mu.Unlock()
	for _, s := range held {
		req := new(dns.Msg)
		if err := req.Unpack(s.query); err != nil {
			panic(err)
		}
		m := fakeupstream.Answer(req)
		if rcode != dns.RcodeSuccess {
			m = new(dns.Msg)
			m.SetRcode(req, rcode)
		}
		b, err := m.Pack()
		if err != nil {
			panic(err)
		}
		s.done(s.query, b, nil)
	}
}

// setClock is a clock the test sets, backwards too. It has no timers of
// its own: the client-response timer runs on real ones.
type setClock struct{ ns atomic.Int64 }

func (c *setClock) Now() time.Time  { return time.Unix(0, c.ns.Load()) }
func (c *setClock) set(t time.Time) { c.ns.Store(t.UnixNano()) }

// lateRig is a proxy on a held upstream (or two, the first behind a
// breaker), with a pausing outbound limit, and the queries it was given.
type lateRig struct {
	p       *proxy
	srv     *dnsserver.Server
	ups     []*heldForwarder
	breaker *guard.Breaker // the first upstream's; nil: none
	bclock  *guard.ManualClock
	out     *pausingOutbound
	clock   *setClock
}

type lateRigConfig struct {
	members     int           // upstreams (default 1)
	breaker     bool          // the first upstream behind a breaker
	maxInflight int64         // default 1000
	cache       bool          // serve-stale on, prefetch on
	staleWait   time.Duration // the client-response timer (cache on)
}

func newLateRig(t *testing.T, rc lateRigConfig) *lateRig {
	t.Helper()
	r := &lateRig{out: &pausingOutbound{}, clock: &setClock{}}
	r.clock.set(tc0)
	var members []pool.Member
	for i := range max(rc.members, 1) {
		up := &heldForwarder{}
		r.ups = append(r.ups, up)
		m := pool.Member{Name: "held", Upstream: untimed{up}}
		if i == 0 && rc.breaker {
			r.bclock = guard.NewManualClock(tc0)
			r.breaker = guard.NewBreaker(guard.BreakerConfig{Window: 10, MinSamples: 1, FailThreshold: 0.5, CoolOff: time.Second}, r.bclock)
			m.Breaker = r.breaker
		}
		members = append(members, m)
	}
	pl, err := pool.New(pool.Config{Members: members, Valid: validReply, Outbound: r.out})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pl.Close() })
	m := metrics.New()
	r.p = &proxy{maxInflight: 1000, upstreams: pl, metrics: m}
	if rc.maxInflight > 0 {
		r.p.maxInflight = rc.maxInflight
	}
	if rc.cache {
		cfg := withCache(Config{})
		cfg.CachePrefetch, cfg.CacheStaleWait = true, rc.staleWait
		answers, err := newAnswerCache(cfg, r.clock, m)
		if err != nil {
			t.Fatal(err)
		}
		r.p.cache, r.p.clock = answers, r.clock
	}
	r.srv = &dnsserver.Server{Handler: dnsserver.HandlerFunc(func(w dnsserver.ResponseWriter, q *dnsserver.Query) {
		lw := w.(*lateWriter)
		q.Net, q.Client = lw.network, lw.client
		r.p.handleQuery(w, q)
	})}
	return r
}

// lateWriter is one client: its answers (one expected) and when the
// handler returned.
type lateWriter struct {
	waitingRecorder
	network  string
	client   netip.AddrPort
	id       uint16
	returned chan struct{}
}

// send runs one query for name, with EDNS, over network, from a client of
// its own, on a goroutine of its own; the handler may pause inside it.
func (r *lateRig) send(t *testing.T, network, name string, id uint16) *lateWriter {
	t.Helper()
	q := query(name, dns.TypeA)
	q.Id = id
	q.SetEdns0(1232, false)
	b, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	w := &lateWriter{network: network, id: id, returned: make(chan struct{}),
		client: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, byte(id >> 8), byte(id)}), 5300)}
	w.done = make(chan struct{})
	go func() {
		defer close(w.returned)
		r.srv.ServePacket(w, b)
	}()
	return w
}

// within waits for ch, failing after 5 s.
func within(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// answered waits for w's answer and returns it, failing unless it is the
// one answer w got, to w's ID.
func (w *lateWriter) answered(t *testing.T, what string) *dns.Msg {
	t.Helper()
	within(t, what+": its answer", w.done)
	within(t, what+": the handler's return", w.returned)
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.out) != 1 || w.dropped != 0 {
		t.Fatalf("%s: %d answers and %d drops, want one answer", what, len(w.out), w.dropped)
	}
	m := new(dns.Msg)
	if err := m.Unpack(w.out[0]); err != nil {
		t.Fatalf("%s: the answer does not parse: %v", what, err)
	}
	if m.Id != w.id {
		t.Fatalf("%s: ID %d, want %d", what, m.Id, w.id)
	}
	return m
}

// writes is how many answers and drops w has had so far.
func (w *lateWriter) writes() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.out) + w.dropped
}

func (r *lateRig) sent() (n int64) {
	for _, up := range r.ups {
		n += up.n.Load()
	}
	return n
}

// wantInflight fails unless the cap's count and the gauge both read n.
func (r *lateRig) wantInflight(t *testing.T, what string, n int64) {
	t.Helper()
	if got, gauge := r.p.inflight.Load(), testutil.ToFloat64(r.p.metrics.InFlight); got != n || gauge != float64(n) {
		t.Fatalf("%s: %d in flight, gauge %v, want %d", what, got, gauge, n)
	}
}

func (r *lateRig) coalesced() int { return int(testutil.ToFloat64(r.p.metrics.Coalesced)) }

// A query held inside Acquire while an identical one started its flight
// joins that flight at step 5: one upstream query, the late one counted
// coalesced, its place under the cap given back at once, its breaker
// permit given back with no sample (a half-open probe's place free again),
// and each client answered once, with its own ID. Over another network it
// joins nothing.
func TestLateJoinGivesBackWhatTheGatesGave(t *testing.T) {
	tests := []struct {
		name           string
		late, first    string // networks
		probe          bool   // the late query holds the first upstream's half-open probe
		wantSent       int64
		wantCoalesced  int
		wantInflightAt int64 // while the upstream holds what it was sent
	}{
		{name: "udp joins udp", late: "udp", first: "udp", wantSent: 1, wantCoalesced: 1, wantInflightAt: 1},
		{name: "tcp joins tcp", late: "tcp", first: "tcp", wantSent: 1, wantCoalesced: 1, wantInflightAt: 1},
		{name: "tcp does not join udp", late: "tcp", first: "udp", wantSent: 2, wantInflightAt: 2},
		{name: "udp does not join tcp", late: "udp", first: "tcp", wantSent: 2, wantInflightAt: 2},
		{name: "the probe's place is freed", late: "udp", first: "udp", probe: true, wantSent: 1, wantCoalesced: 1, wantInflightAt: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newLateRig(t, lateRigConfig{members: 2, breaker: true})
			if tt.probe { // open the first upstream's breaker, then let the cool-off pass
				p, err := r.breaker.Acquire()
				if err != nil {
					t.Fatal(err)
				}
				p.Failure()
				r.bclock.Advance(time.Second)
			}
			r.out.arm(t)
			late := r.send(t, tt.late, "same.example", 1)
			release := r.out.waitPaused(t)
			first := r.send(t, tt.first, "same.example", 2)
			within(t, "the first query's handler", first.returned)
			if tt.probe && r.ups[1].n.Load() != 1 {
				t.Fatalf("the first query went to upstream 0 (%d) / 1 (%d), want 1: the probe is the late query's", r.ups[0].n.Load(), r.ups[1].n.Load())
			}
			release()
			within(t, "the late query's handler", late.returned)
			if got := r.sent(); got != tt.wantSent {
				t.Fatalf("the upstreams got %d queries, want %d", got, tt.wantSent)
			}
			if got := r.coalesced(); got != tt.wantCoalesced {
				t.Fatalf("coalesced %d, want %d", got, tt.wantCoalesced)
			}
			r.wantInflight(t, "while the upstream holds the query", tt.wantInflightAt)
			if late.writes() != 0 || first.writes() != 0 {
				t.Fatalf("answered before the upstream: late %d, first %d", late.writes(), first.writes())
			}
			if tt.probe {
				// Given back with no sample: still half-open, and the next
				// call is the probe.
				if s := r.breaker.State(); s != guard.HalfOpen {
					t.Fatalf("breaker %v after the cancelled probe, want half-open", s)
				}
				p, err := r.breaker.Acquire()
				if err != nil {
					t.Fatalf("the probe's place is still taken after the late query joined: %v", err)
				}
				p.Cancel()
			}
			for _, up := range r.ups {
				up.end(dns.RcodeSuccess)
			}
			for _, w := range []*lateWriter{late, first} {
				if m := w.answered(t, w.network+" client"); m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
					t.Fatalf("%s client: %s %s", w.network, rcodeName(m), answerText(m))
				}
			}
			if got := outcomes(r.p, "A", "forwarded"); got != 2 {
				t.Fatalf("forwarded %d, want 2", got)
			}
			r.wantInflight(t, "with every answer given", 0)
			if got := flightsOut(r.p); got != 0 {
				t.Fatalf("%d flights left in the tables", got)
			}
		})
	}
}

// prime stores name in r's cache at tc0 (TTL 60).
func (r *lateRig) prime(t *testing.T, name string) {
	t.Helper()
	r.clock.set(tc0)
	w := r.send(t, "udp", name, 60000)
	within(t, "the priming query to reach the upstream", w.returned)
	r.ups[0].end(dns.RcodeSuccess)
	if m := w.answered(t, "the priming query"); m.Rcode != dns.RcodeSuccess {
		t.Fatalf("priming: %s", rcodeName(m))
	}
}

// isStale reports whether m is a stale answer: NOERROR, one record, TTL 30.
func isStale(m *dns.Msg) bool {
	return m.Rcode == dns.RcodeSuccess && len(m.Answer) == 1 && m.Answer[0].Header().Ttl == 30
}

// The late join keeps the serve-stale rules of the early one (join): a
// query holding an expired entry joins only a flight that holds one too,
// and is answered stale at once when the name's refresh is out but cannot
// take it (its timer fired, or it is full); a prefetch joins any flight.
// Each client is answered once, what the gates gave is given back, and the
// upstream gets one refresh.
func TestLateJoinKeepsTheStaleRules(t *testing.T) {
	const name = "www.example.com"
	expired, prefetchAt := tc0.Add(61*time.Second), tc0.Add(55*time.Second)
	tests := []struct {
		name      string
		cache     bool
		staleWait time.Duration
		lateAt    time.Time // the clock when the late query is looked up (zero: no cache)
		firstAt   time.Time // ... the first one
		followers int       // identical queries that join the first one's flight at step 2
		waitFirst bool      // the first one's client answered (its timer fired) before the late one goes on
		end       int       // the upstream's rcode
		// what the late query gets and does
		wantSent      int64 // beyond the priming query
		wantCoalesced int
		wantLate      string // "stale", "fresh" or "" (a prefetch: no one to answer)
		wantFirst     string
	}{
		{name: "expired joins expired", cache: true, lateAt: expired, firstAt: expired, end: dns.RcodeServerFailure,
			wantSent: 1, wantCoalesced: 1, wantLate: "stale", wantFirst: "stale"},
		{name: "expired does not join a prefetch", cache: true, lateAt: expired, firstAt: prefetchAt, end: dns.RcodeServerFailure,
			wantSent: 2, wantLate: "stale", wantFirst: "fresh"}, // the prefetch's client had its answer from the cache
		{name: "expired, the refresh's timer fired: stale at once", cache: true, staleWait: 5 * time.Millisecond, lateAt: expired, firstAt: expired,
			waitFirst: true, end: dns.RcodeSuccess, wantSent: 1, wantLate: "stale", wantFirst: "stale"},
		{name: "expired, the refresh full: stale at once", cache: true, lateAt: expired, firstAt: expired, followers: maxFollowers,
			end: dns.RcodeSuccess, wantSent: 1, wantCoalesced: maxFollowers, wantLate: "stale", wantFirst: "fresh"},
		{name: "no entry, the flight full: a flight beside it", followers: maxFollowers,
			end: dns.RcodeSuccess, wantSent: 2, wantCoalesced: maxFollowers, wantLate: "fresh", wantFirst: "fresh"},
		{name: "a prefetch joins an expired one's refresh", cache: true, lateAt: prefetchAt, firstAt: expired, end: dns.RcodeServerFailure,
			wantSent: 1, wantCoalesced: 1, wantLate: "fresh", wantFirst: "stale"}, // the prefetch's client: from the cache
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newLateRig(t, lateRigConfig{cache: tt.cache, staleWait: tt.staleWait})
			if tt.cache {
				r.prime(t, name)
			}
			primed := r.sent()
			r.clock.set(tt.lateAt)
			r.out.arm(t)
			late := r.send(t, "udp", name, 1)
			release := r.out.waitPaused(t)
			r.clock.set(tt.firstAt)
			first := r.send(t, "udp", name, 2)
			within(t, "the first query's handler", first.returned)
			var followers []*lateWriter
			for i := range tt.followers {
				w := r.send(t, "udp", name, uint16(100+i))
				within(t, "a follower's handler", w.returned)
				followers = append(followers, w)
			}
			if tt.waitFirst {
				within(t, "the first query's client-response timer", first.done)
			}
			release()
			within(t, "the late query's handler", late.returned)
			if got := r.sent() - primed; got != tt.wantSent {
				t.Fatalf("the upstream got %d queries, want %d", got, tt.wantSent)
			}
			if got := r.coalesced(); got != tt.wantCoalesced {
				t.Fatalf("coalesced %d, want %d", got, tt.wantCoalesced)
			}
			r.wantInflight(t, "while the upstream holds them", tt.wantSent)
			r.ups[0].end(tt.end)
			check := func(w *lateWriter, what, want string) {
				t.Helper()
				m := w.answered(t, what)
				switch got := isStale(m); {
				case want == "stale" && !got, want == "fresh" && (got || m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1):
					t.Fatalf("%s: %s %s, want %s", what, rcodeName(m), answerText(m), want)
				}
			}
			check(late, "the late query", tt.wantLate)
			check(first, "the first query", tt.wantFirst)
			for _, w := range followers {
				check(w, "a follower", tt.wantFirst)
			}
			r.wantInflight(t, "with every answer given", 0)
			if got := flightsOut(r.p); got != 0 {
				t.Fatalf("%d flights left in the tables", got)
			}
			for _, w := range append(followers, late, first) {
				if n := w.writes(); n != 1 {
					t.Fatalf("client %d: %d answers, want 1", w.id, n)
				}
			}
		})
	}
}

// heldBoth is a loopback upstream over UDP and TCP on one port that counts
// every query the moment it reads it and answers only on release.
type heldBoth struct {
	udp     *heldUpstream
	ln      *net.TCPListener
	tcp     atomic.Int64
	mu      sync.Mutex
	held    []heldTCP
	wg      sync.WaitGroup
	conns   map[net.Conn]bool
	closing atomic.Bool
}

type heldTCP struct {
	req  *dns.Msg
	conn net.Conn
}

func startHeldBoth(t *testing.T) *heldBoth {
	t.Helper()
	u := startHeldUpstream(t)
	ua := u.conn.LocalAddr().(*net.UDPAddr)
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ua.IP, Port: ua.Port})
	if err != nil {
		t.Fatal(err)
	}
	h := &heldBoth{udp: u, ln: ln, conns: map[net.Conn]bool{}}
	t.Cleanup(func() {
		h.closing.Store(true)
		ln.Close()
		h.mu.Lock()
		for c := range h.conns {
			c.Close()
		}
		h.mu.Unlock()
		h.wg.Wait()
	})
	h.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			if h.closing.Load() {
				h.mu.Unlock()
				c.Close()
				return
			}
			h.conns[c] = true
			h.mu.Unlock()
			h.wg.Go(func() {
				co := &dns.Conn{Conn: c}
				for {
					req, err := co.ReadMsg()
					if err != nil {
						return
					}
					h.mu.Lock()
					h.held = append(h.held, heldTCP{req, c})
					h.mu.Unlock()
					h.tcp.Add(1)
				}
			})
		}
	})
	return h
}

func (h *heldBoth) received() int64 { return h.udp.received.Load() + h.tcp.Load() }

// release answers every query held, over both networks.
func (h *heldBoth) release() {
	h.udp.release()
	h.mu.Lock()
	held := h.held
	h.held = nil
	h.mu.Unlock()
	for _, q := range held {
		co := &dns.Conn{Conn: q.conn}
		co.WriteMsg(fakeupstream.Answer(q.req))
	}
}

// Bursts of one name from many client addresses in 127.0.0.0/8, over UDP
// and TCP at once, through the whole proxy: each network's burst goes
// upstream once, every client is answered once with its own ID, the
// counters add up, nothing is left in flight, and a shutdown begun while
// the last bursts' answers are held drains them all.
func TestBurstsFromManySourcesGoUpstreamOncePerNetwork(t *testing.T) {
	up := startHeldBoth(t)
	cfg := testConfig(up.udp.conn.LocalAddr().String())
	cfg.UpstreamTimeout = 10 * time.Second // held while the burst is counted
	a := startProxy(t, cfg, guard.RealClock{})
	const rounds, udpClients, tcpClients = 6, 40, 12
	deadline := time.Now().Add(60 * time.Second)
	total := 0
	for round := 0; round < rounds && time.Now().Before(deadline); round++ {
		last := round == rounds-1
		sentBefore := up.received()
		udpBefore, tcpBefore := up.udp.received.Load(), up.tcp.Load()
		joinedBefore := testutil.ToFloat64(a.metrics.Coalesced)
		name := fmt.Sprintf("r%d.example.com", round)
		start := make(chan struct{})
		type reply struct {
			id  uint16
			net string
			m   *dns.Msg // nil: no answer
		}
		replies := make(chan reply, udpClients+tcpClients)
		for c := range udpClients + tcpClients {
			network, src := "udp", net.IPv4(127, 0, byte(round+1), byte(10+c))
			if c >= udpClients {
				network = "tcp"
			}
			go func() {
				q := query(name, dns.TypeA)
				q.Id = uint16(1000*round + c)
				<-start
				m := askFrom(t, network, src.String(), a.addr(), q, 10*time.Second)
				replies <- reply{q.Id, network, m}
			}()
		}
		close(start)
		waitFor(t, "every query of the burst sent upstream or joined", func() bool {
			return int(up.received()-sentBefore)+int(testutil.ToFloat64(a.metrics.Coalesced)-joinedBefore) == udpClients+tcpClients
		})
		if udp, tcp := up.udp.received.Load()-udpBefore, up.tcp.Load()-tcpBefore; udp != 1 || tcp != 1 {
			t.Fatalf("round %d: a burst went upstream %d times over UDP and %d over TCP, want once a network", round, udp, tcp)
		}
		var shut chan error
		if last {
			if a.server.Unanswered() != udpClients+tcpClients {
				t.Fatalf("round %d: %d unanswered while the upstream holds the burst, want %d", round, a.server.Unanswered(), udpClients+tcpClients)
			}
			shut = make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				shut <- a.shutdown(ctx)
			}()
			waitFor(t, "the shutdown to stop the readers", func() bool { return a.draining.Load() })
		}
		up.release()
		for range udpClients + tcpClients {
			select {
			case r := <-replies:
				if r.m == nil || r.m.Id != r.id || r.m.Rcode != dns.RcodeSuccess || len(r.m.Answer) != 1 {
					t.Fatalf("round %d, %s client %d: %v, want its own answer", round, r.net, r.id, r.m)
				}
			case <-time.After(15 * time.Second):
				t.Fatalf("round %d: a client has no answer", round)
			}
		}
		total += udpClients + tcpClients
		if last {
			select {
			case err := <-shut:
				if err != nil {
					t.Fatalf("the shutdown: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("the shutdown did not end")
			}
			if n := a.server.Unanswered(); n != 0 {
				t.Fatalf("%d unanswered after the drain", n)
			}
		}
	}
	if got := count(a, "A", "forwarded", total); got != total {
		t.Fatalf("forwarded %d, want %d: one a client", got, total)
	}
	if got, want := int(testutil.ToFloat64(a.metrics.Coalesced)), total-2*rounds; got != want {
		t.Fatalf("coalesced %d, want %d", got, want)
	}
	waitFor(t, "nothing in flight", func() bool { return testutil.ToFloat64(a.metrics.InFlight) == 0 })
	if n := a.proxy.inflight.Load(); n != 0 {
		t.Fatalf("%d counted in flight with every answer given", n)
	}
}

// Identical queries at the same instant where the late join cannot help:
// the second is refused at a gate the first holds (its place under the
// cap, the half-open probe, the outbound limit's last token) before the
// first's flight is in the table, or the first's flight lands, its answer
// cached, while the second is inside Acquire. Each client is still
// answered exactly once and counted once, and nothing stays in flight. The
// second's answer is what these edges give today: REFUSED, SERVFAIL,
// REFUSED, and a second upstream query for an answer already cached.
func TestSameInstantEdgesBeyondTheLateJoin(t *testing.T) {
	tests := []struct {
		name       string
		rc         lateRigConfig
		setup      func(r *lateRig)
		firstLands bool // the first lands while the second is held in Acquire
		wantRcode  int  // the second's
		wantAs     string
		wantSent   int64
	}{
		{name: "the cap's one place held", rc: lateRigConfig{maxInflight: 1},
			wantRcode: dns.RcodeRefused, wantAs: "overloaded", wantSent: 1},
		{name: "the probe held", rc: lateRigConfig{breaker: true}, setup: func(r *lateRig) {
			p, err := r.breaker.Acquire()
			if err != nil {
				panic(err)
			}
			p.Failure()
			r.bclock.Advance(time.Second)
		}, wantRcode: dns.RcodeServerFailure, wantAs: "breaker_open", wantSent: 1},
		{name: "the last outbound token taken", setup: func(r *lateRig) { r.out.refuse.Store(true) },
			wantRcode: dns.RcodeRefused, wantAs: "upstream_limited", wantSent: 1},
		{name: "the first landed and cached meanwhile", rc: lateRigConfig{cache: true}, firstLands: true,
			wantRcode: dns.RcodeSuccess, wantAs: "forwarded", wantSent: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newLateRig(t, tt.rc)
			if tt.setup != nil {
				tt.setup(r)
			}
			r.out.arm(t)
			var first, second *lateWriter
			if tt.firstLands {
				second = r.send(t, "udp", "same.example", 2)
				release := r.out.waitPaused(t)
				first = r.send(t, "udp", "same.example", 1)
				within(t, "the first query's handler", first.returned)
				r.ups[0].end(dns.RcodeSuccess)
				first.answered(t, "the first query")
				release()
				within(t, "the second query's handler", second.returned)
			} else { // the first holds the gate inside Acquire
				first = r.send(t, "udp", "same.example", 1)
				release := r.out.waitPaused(t)
				second = r.send(t, "udp", "same.example", 2)
				within(t, "the second query's handler", second.returned)
				r.out.refuse.Store(false)
				release()
				within(t, "the first query's handler", first.returned)
			}
			if got := r.sent(); got != tt.wantSent {
				t.Fatalf("the upstream got %d queries, want %d", got, tt.wantSent)
			}
			r.ups[0].end(dns.RcodeSuccess)
			if m := first.answered(t, "the first query"); m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
				t.Fatalf("the first query: %s %s", rcodeName(m), answerText(m))
			}
			if m := second.answered(t, "the second query"); m.Rcode != tt.wantRcode {
				t.Fatalf("the second query: %s, want %s", rcodeName(m), dns.RcodeToString[tt.wantRcode])
			}
			want := map[string]int{"forwarded": 1}
			want[tt.wantAs]++
			for as, n := range want {
				if got := outcomes(r.p, "A", as); got != n {
					t.Fatalf("%s %d, want %d", as, got, n)
				}
			}
			if got := r.coalesced(); got != 0 {
				t.Fatalf("coalesced %d, want 0", got)
			}
			r.wantInflight(t, "with every answer given", 0)
			if got := flightsOut(r.p); got != 0 {
				t.Fatalf("%d flights left in the tables", got)
			}
			if r.breaker != nil {
				if s := r.breaker.State(); s != guard.Closed {
					t.Fatalf("breaker %v after the probe's answer, want closed", s)
				}
			}
			for _, w := range []*lateWriter{first, second} {
				if n := w.writes(); n != 1 {
					t.Fatalf("client %d: %d answers, want 1", w.id, n)
				}
			}
		})
	}
}
