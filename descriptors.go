package main

import "fmt"

// otherDescriptors is what the proxy keeps for its descriptors besides
// client TCP connections: its listening sockets (a UDP one per core), the
// upstreams' UDP sockets (8 each, and as many retiring), their TCP
// connections, the metrics listener and its clients, the query log, Redis.
const otherDescriptors = 256

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
