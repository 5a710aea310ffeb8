package main

import (
	"log/slog"

	"dnsproxi/fleet"
	"dnsproxi/guard"
	"dnsproxi/metrics"
	"dnsproxi/pool"
)

// The outbound limit (DNS_UPSTREAM_RATE_LIMIT) protects what is downstream:
// the upstreams' quota. Every attempt the set of upstreams sends pays one
// token of it, right before the send (pool/): first attempts, retries,
// hedges. It is a local token bucket, or with DNS_UPSTREAM_RATE_LIMIT_REDIS
// the fleet's limiter, whose rate is the total of every instance on that
// Redis and key (fleet/). DNS_RATE_LIMIT, the entry gate, is another thing:
// it counts the queries clients send, answered from anywhere.

// newOutbound builds the outbound limit cfg asks for: nil (off), a local
// token bucket, or the fleet's limiter, which serves its series and logs
// each switch of mode. A Redis that does not answer at start-up is no
// error: the limiter starts local and the log says so.
func newOutbound(cfg Config, clock guard.Clock, m *metrics.Metrics, log *slog.Logger) (pool.Outbound, error) {
	limit := cfg.UpstreamRateLimit
	if !limit.On() {
		return nil, nil
	}
	if cfg.UpstreamRateLimitRedis == "" {
		return guard.NewTokenBucket(limit.Rate, limit.Burst, clock), nil
	}
	switches := newSwitchLog(log, cfg.UpstreamRateLimitRedis.String())
	l, err := fleet.New(fleet.Config{
		URL:      string(cfg.UpstreamRateLimitRedis),
		Key:      cfg.UpstreamRateLimitKey,
		Rate:     limit.Rate,
		Burst:    limit.Burst,
		Timeout:  cfg.UpstreamRateLimitTimeout,
		Fallback: float64(cfg.UpstreamRateLimitFallback),
		Clock:    clock,
		OnSwitch: switches.add,
	})
	if err != nil { // checkOutbound has refused what New would
		switches.close()
		return nil, err
	}
	m.WatchOutbound(func() metrics.OutboundStats {
		c := l.RedisCalls()
		return metrics.OutboundStats{
			Shared:      l.Mode() == fleet.ModeShared,
			RedisCalls:  [3]uint64{c.OK, c.Error, c.Timeout}, // in metrics.RedisResults' order
			Instances:   l.Instances(),
			LeaseTokens: l.LeaseTokens(),
		}
	})
	return &fleetOutbound{Limiter: l, switches: switches}, nil
}

// fleetOutbound is the fleet's limiter with the log of its switches.
type fleetOutbound struct {
	*fleet.Limiter
	switches *switchLog
}

// Close takes the instance out of the fleet, then stops the switch log.
func (o *fleetOutbound) Close() error {
	err := o.Limiter.Close()
	o.switches.close()
	return err
}

// switchQueue bounds the switches waiting to be logged. A limiter switches
// at most about twice a second (it checks Redis once a second), so a full
// queue means stderr has stalled; a switch beyond it is not logged, and
// the mode series still shows it.
const switchQueue = 16

// switchLog logs the fleet limiter's switches of mode, each once, on a
// goroutine of its own: OnSwitch runs on the limiter's goroutine, which
// must never wait for a slow stderr.
type switchLog struct {
	log   *slog.Logger
	redis string // the URL, its password redacted
	queue chan fleet.Switch
	done  chan struct{}
}

func newSwitchLog(log *slog.Logger, redis string) *switchLog {
	s := &switchLog{log: log, redis: redis, queue: make(chan fleet.Switch, switchQueue), done: make(chan struct{})}
	go s.run()
	return s
}

// add queues sw without waiting.
func (s *switchLog) add(sw fleet.Switch) {
	select {
	case s.queue <- sw:
	default:
	}
}

// close logs what is queued and stops the goroutine.
func (s *switchLog) close() {
	close(s.queue)
	<-s.done
}

func (s *switchLog) run() {
	defer close(s.done)
	for sw := range s.queue {
		if sw.To == fleet.ModeShared {
			s.log.Info("upstream rate limit: shared with the fleet on Redis", "mode", "shared", "instances", sw.Instances, "redis", s.redis)
			continue
		}
		why := "Redis failed or is slow"
		if sw.Instances == 0 {
			why = "Redis not reached yet, the fallback rate"
		}
		// sw.Err names Redis with the password redacted (fleet's promise).
		s.log.Warn("upstream rate limit: local share, "+why, "mode", "local", "rate", sw.Rate, "instances", sw.Instances, "err", sw.Err)
	}
}
