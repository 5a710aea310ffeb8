package main

import (
	"dnsproxi/dnsserver"
	"dnsproxi/metrics"
	"dnsproxi/pool"
)

// internalCounts are the parts of the proxy whose own counts /metrics
// serves (metrics.Internals): the log queues whose lines a stalled stderr
// drops, the pool whose hedges a stalled process reaches too late, and the
// server whose graceful TCP closes a flood of connections outruns. A part
// that is nil counts nothing.
type internalCounts struct {
	logs   []*asyncLog
	hedges *pool.Pool
	server *dnsserver.Server
}

// read returns the counts, as they are now.
func (c internalCounts) read() metrics.Internals {
	var in metrics.Internals
	for _, l := range c.logs {
		in.LogDropped += l.Dropped()
	}
	if c.hedges != nil {
		in.LateHedges = c.hedges.LateHedges()
	}
	if c.server != nil {
		in.ForcedCloses = c.server.ForcedCloses()
	}
	return in
}
