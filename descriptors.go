package main

import (
	"fmt"
	"runtime"

	"dnsproxi/upstream"
)

// The file descriptors the proxy keeps besides client TCP connections (its
// reserve), by what holds them. The reserve is computed from the
// configuration: a constant of 256 held one upstream with room to spare,
// and was passed by the sockets of 12 upstreams alone, so a
// DNS_TCP_MAX_CONNS that fitted on paper ran out at run time
// (TestDescriptorReserveCountsTheUpstreams). Go raises the soft limit to the
// hard one, 524,288 under systemd, so the reserve binds only where the hard
// limit is low.
const (
	// fixedDescriptors: the standard streams, the runtime's poller, the TCP
	// listener, the query log and the file that replaces it on SIGHUP,
	// Redis's two connections (fleet), files read while serving, and room
	// for what the runtime and the libraries open.
	fixedDescriptors = 64
	// upstreamDescriptors: each upstream's UDP sockets, as many retiring
	// (each reads until the queries it carries are answered or expired) and
	// its TCP connections (upstream's tcpSlots).
	upstreamDescriptors = 2*upstream.DefaultUDPSockets + 4
	// lingeringDescriptors: client connections closing gracefully beyond
	// DNS_TCP_MAX_CONNS (dnsserver's maxLingering).
	lingeringDescriptors = 64
	// metricsDescriptors: the metrics listener and its clients, when on.
	metricsDescriptors = 1 + maxMetricsConns
)

// udpListeners is how many UDP sockets the server listens on: one per core
// (dnsserver.Server.UDPSockets' default; one where the system lacks
// SO_REUSEPORT, which this counts high).
func udpListeners() int { return runtime.GOMAXPROCS(0) }

// reserve is what c keeps for descriptors besides client TCP connections,
// with listeners UDP listening sockets, and the same as one line's
// account of it for the errors and the log.
func (c *Config) reserve(listeners int) (uint64, string) {
	upstreams := len(c.Upstreams())
	n := fixedDescriptors + lingeringDescriptors + listeners + upstreams*upstreamDescriptors
	metrics := ""
	if c.MetricsAddr != "off" {
		n += metricsDescriptors
		metrics = fmt.Sprintf(", metrics %d", metricsDescriptors)
	}
	return uint64(n), fmt.Sprintf("upstreams %d×%d, UDP listeners %d%s, closing connections %d, fixed %d",
		upstreams, upstreamDescriptors, listeners, metrics, lingeringDescriptors, fixedDescriptors)
}

// fitDescriptors checks DNS_TCP_MAX_CONNS against limit (checkDescriptors).
// A cap the operator set that does not fit is an error; the default is
// lowered to what fits instead, noted in tcpConnsLowered for the start-up
// log, so that the proxy starts where the limit is low.
func (c *Config) fitDescriptors(limit uint64, listeners int, set bool) error {
	err := c.checkDescriptors(limit, listeners)
	reserve, _ := c.reserve(listeners)
	if err == nil || set || limit <= reserve {
		return err
	}
	c.tcpConnsLowered = c.TCPMaxConns
	c.TCPMaxConns = int(limit - reserve)
	c.descriptors = limit
	c.reserved = reserve
	return nil
}

// loweredWarning is the start-up log's line when fitDescriptors lowered
// the default cap, or "".
func (c *Config) loweredWarning() string {
	if c.tcpConnsLowered == 0 {
		return ""
	}
	return fmt.Sprintf("%s: the default, %d, lowered to %d: the process may open %d file descriptors (ulimit -n) and keeps %d for its other sockets and files",
		keyTCPMaxConns, c.tcpConnsLowered, c.TCPMaxConns, c.descriptors, c.reserved)
}

// checkDescriptors refuses a DNS_TCP_MAX_CONNS that the process's file
// descriptor limit cannot hold beside everything else (limit 0: unknown,
// nothing checked), with listeners UDP listening sockets. At the limit
// accept fails before the server sees the connection, so no idle one could
// be closed for it: TCP would be shut to every new client, the lock-out the
// slot eviction exists to prevent; and an upstream's socket fails to open.
func (c *Config) checkDescriptors(limit uint64, listeners int) error {
	reserve, account := c.reserve(listeners)
	if limit == 0 || uint64(c.TCPMaxConns)+reserve <= limit {
		return nil
	}
	most := "none fit" // the limit holds no more than the rest
	if limit > reserve {
		most = fmt.Sprintf("at most %d", limit-reserve)
	}
	return fmt.Errorf("%s=%q: must leave %d of the process's %d file descriptors (ulimit -n) for its other sockets and files (%s): %s, or raise the limit",
		keyTCPMaxConns, fmt.Sprint(c.TCPMaxConns), reserve, limit, account, most)
}
