package main

import "fmt"

// otherDescriptors is what the proxy keeps for its descriptors besides
// client TCP connections: its listening sockets (a UDP one per core), the
// upstreams' UDP sockets (8 each, and as many retiring), their TCP
// connections (4 each), the metrics listener and its clients, the query
// log, Redis, and the client connections closing gracefully beyond
// DNS_TCP_MAX_CONNS (at most 64, dnsserver's maxLingering): about 150 with
// one upstream. (With many upstreams, 9 or more, their sockets alone could
// pass it; Go raises the soft limit to the hard one, 524,288 under systemd,
// so it binds only where the hard limit is low.)
const otherDescriptors = 256

// fitDescriptors checks DNS_TCP_MAX_CONNS against limit (checkDescriptors).
// A cap the operator set that does not fit is an error; the default is
// lowered to what fits instead, noted in tcpConnsLowered for the start-up
// log, so that the proxy starts where the limit is low.
func (c *Config) fitDescriptors(limit uint64, set bool) error {
	err := c.checkDescriptors(limit)
	if err == nil || set || limit <= otherDescriptors {
		return err
	}
	c.tcpConnsLowered = c.TCPMaxConns
	c.TCPMaxConns = int(limit - otherDescriptors)
	c.descriptors = limit
	return nil
}

// loweredWarning is the start-up log's line when fitDescriptors lowered
// the default cap, or "".
func (c *Config) loweredWarning() string {
	if c.tcpConnsLowered == 0 {
		return ""
	}
	return fmt.Sprintf("%s: the default, %d, lowered to %d: the process may open %d file descriptors (ulimit -n) and keeps %d for its other sockets and files",
		keyTCPMaxConns, c.tcpConnsLowered, c.TCPMaxConns, c.descriptors, otherDescriptors)
}

// checkDescriptors refuses a DNS_TCP_MAX_CONNS that the process's file
// descriptor limit cannot hold beside everything else (limit 0: unknown,
// nothing checked). At the limit accept fails before the server sees the
// connection, so no idle one could be closed for it: TCP would be shut to
// every new client, the lock-out the slot eviction exists to prevent.
func (c *Config) checkDescriptors(limit uint64) error {
	if limit == 0 || uint64(c.TCPMaxConns)+otherDescriptors <= limit {
		return nil
	}
	most := "none fit" // the limit holds no more than the rest
	if limit > otherDescriptors {
		most = fmt.Sprintf("at most %d", limit-otherDescriptors)
	}
	return fmt.Errorf("%s=%q: must leave %d of the process's %d file descriptors (ulimit -n) for its other sockets and files: %s, or raise the limit",
		keyTCPMaxConns, fmt.Sprint(c.TCPMaxConns), otherDescriptors, limit, most)
}
