// Package upstream is the client side of the proxy: it exchanges a query
// with one upstream resolver and returns only a reply that answers it.
//
// Every exchange goes out under a fresh random message ID; a reply is
// accepted only if its ID, QR bit and question (name, type, class) match what
// was sent, and anything else is ignored while the exchange keeps waiting
// until its deadline, so a stray or spoofed datagram never reaches the
// client. UDP queries share a fixed set of long-lived sockets, each on its
// own source port, demultiplexed by ID; a UDP reply with TC set is retried
// over TCP; TCP connections are reused and expire when idle.
package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// Defaults for Config's zero fields.
const (
	DefaultTimeout    = 2 * time.Second
	DefaultUDPSockets = 8
	DefaultTCPIdle    = 10 * time.Second
	DefaultTCPConns   = 16
)

// Errors an exchange can end with; callers use errors.Is.
var (
	ErrTimeout = errors.New("upstream: no valid reply before the deadline")
	ErrBusy    = errors.New("upstream: no free message ID on the socket")
	ErrNoQuery = errors.New("upstream: query has no single question")
	ErrClosed  = errors.New("upstream: closed")
)

// Config sets where and how to exchange. A zero field takes its default.
type Config struct {
	Addr       string        // upstream host:port
	Timeout    time.Duration // deadline of one exchange, TC retry included (default 2s)
	UDPSockets int           // long-lived UDP sockets, each its own source port (default 8)
	TCPIdle    time.Duration // an idle TCP connection is closed after this (default 10s)
	TCPConns   int           // idle TCP connections kept for reuse (default 16)
}

// Upstream exchanges queries with one resolver. It is safe for concurrent use.
type Upstream struct {
	cfg   Config
	raddr *net.UDPAddr
	socks []*udpSocket
	next  atomic.Uint32 // round-robin over socks
	tcp   *tcpPool
}

// New resolves cfg.Addr once and opens the UDP sockets.
func New(cfg Config) (*Upstream, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.UDPSockets <= 0 {
		cfg.UDPSockets = DefaultUDPSockets
	}
	if cfg.TCPIdle <= 0 {
		cfg.TCPIdle = DefaultTCPIdle
	}
	if cfg.TCPConns <= 0 {
		cfg.TCPConns = DefaultTCPConns
	}
	raddr, err := net.ResolveUDPAddr("udp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("upstream %q: %w", cfg.Addr, err)
	}
	u := &Upstream{cfg: cfg, raddr: raddr, tcp: newTCPPool(raddr.String(), cfg.TCPConns, cfg.TCPIdle)}
	for range cfg.UDPSockets {
		s, err := dialUDP(raddr)
		if err != nil {
			u.Close()
			return nil, fmt.Errorf("upstream %q: %w", cfg.Addr, err)
		}
		u.socks = append(u.socks, s)
	}
	return u, nil
}

// Addr returns the upstream's address.
func (u *Upstream) Addr() string { return u.raddr.String() }

// Close closes every socket; exchanges under way end with an error.
func (u *Upstream) Close() error {
	for _, s := range u.socks {
		s.close()
	}
	u.tcp.close()
	return nil
}

// Exchange sends req to the upstream over network ("udp" or "tcp") and
// returns the first valid reply, with req's ID. Over UDP, a truncated reply
// is retried over TCP. The exchange ends at the configured timeout or when
// ctx ends, whichever comes first. req is not modified.
func (u *Upstream) Exchange(ctx context.Context, req *dns.Msg, network string) (*dns.Msg, error) {
	if len(req.Question) != 1 {
		return nil, ErrNoQuery
	}
	wire, err := req.Pack()
	if err != nil {
		return nil, fmt.Errorf("upstream: packing the query: %w", err)
	}
	deadline := time.Now().Add(u.cfg.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	q := req.Question[0]
	var reply *dns.Msg
	if network != "tcp" {
		s := u.socks[int(u.next.Add(1))%len(u.socks)]
		reply, err = s.exchange(ctx, wire, q, deadline)
		if err != nil || !reply.Truncated {
			return restoreID(reply, req.Id), err
		}
	}
	reply, err = u.tcp.exchange(ctx, wire, q, deadline)
	return restoreID(reply, req.Id), err
}

func restoreID(m *dns.Msg, id uint16) *dns.Msg {
	if m != nil {
		m.Id = id
	}
	return m
}

// answers reports whether m is a reply to the question q asked under id.
// Names compare without regard to case: some resolvers change it.
func answers(m *dns.Msg, id uint16, q dns.Question) bool {
	if m.Id != id || !m.Response || len(m.Question) != 1 {
		return false
	}
	got := m.Question[0]
	return got.Qtype == q.Qtype && got.Qclass == q.Qclass && strings.EqualFold(got.Name, q.Name)
}
