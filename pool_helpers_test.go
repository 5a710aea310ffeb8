package main

import (
	"time"

	"dnsproxi/guard"
	"dnsproxi/pool"
	"dnsproxi/upstream"
)

// forwarder is a fake upstream as the unit tests write them: it ends every
// query on its own terms, exactly once.
type forwarder interface {
	Forward(query []byte, network string, done upstream.Result)
}

// untimed lets a forwarder stand in a pool: the deadline is the fake's own.
type untimed struct{ forwarder }

func (u untimed) ForwardUntil(query []byte, network string, _ time.Time, done upstream.Result) {
	u.Forward(query, network, done)
}

// onePool is a set of one upstream, fwd, behind breaker b (nil: none).
func onePool(fwd forwarder, b *guard.Breaker) *pool.Pool {
	p, err := pool.New(pool.Config{Members: []pool.Member{{Name: "fake", Upstream: untimed{fwd}, Breaker: b}}, Valid: validReply})
	if err != nil {
		panic(err)
	}
	return p
}

// breaker returns the breaker of the app's upstream i.
func (a *app) breaker(i int) *guard.Breaker { return a.upstreams.Breaker(i) }
