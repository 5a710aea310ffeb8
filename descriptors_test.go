package main

import (
	"fmt"
	"strings"
	"testing"
)

// loopbackUpstreams is a DNS_UPSTREAM list of n upstreams on loopback.
func loopbackUpstreams(n int) string {
	list := make([]string, n)
	for i := range list {
		list[i] = "127.0.0." + itoa(i+1) + ":53"
	}
	return strings.Join(list, ",")
}

// With 12 upstreams their sockets alone (8 UDP, as many retiring, 4 TCP
// each: 240) pass a fixed reserve of 256 with everything else: a cap that
// fitted it on paper ran out of descriptors at run time. The reserve grows
// with the upstreams, so such a cap is refused, and the default is lowered
// to what is left.
func TestDescriptorReserveCountsTheUpstreams(t *testing.T) {
	c := Config{Upstream: loopbackUpstreams(12), TCPMaxConns: 300, MetricsAddr: "127.0.0.1:9398"}
	if err := c.checkDescriptors(600, 2); err == nil {
		t.Fatalf("300 TCP connections with 12 upstreams under 600 descriptors accepted; their sockets alone take 240")
	}
	d := Config{Upstream: loopbackUpstreams(12), TCPMaxConns: 1000, MetricsAddr: "127.0.0.1:9398"}
	if err := d.fitDescriptors(600, 2, false); err != nil {
		t.Fatal(err)
	}
	if d.TCPMaxConns+12*20 > 600 {
		t.Fatalf("the default lowered to %d with 12 upstreams under 600 descriptors: with their 240 sockets it does not fit", d.TCPMaxConns)
	}
}

// The reserve, part by part: 64 fixed, 64 closing connections, a UDP
// listener per core, 20 per upstream, 65 for the metrics address when on.
func TestDescriptorReserve(t *testing.T) {
	tests := []struct {
		upstreams, listeners int
		metrics              string
		want                 uint64
	}{
		{1, 1, "off", 64 + 64 + 1 + 20},
		{1, 2, "127.0.0.1:9398", 64 + 64 + 2 + 20 + 65},
		{12, 2, "127.0.0.1:9398", 64 + 64 + 2 + 240 + 65},
		{16, 64, "127.0.0.1:9398", 64 + 64 + 64 + 320 + 65},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d upstreams, %d listeners, metrics %s", tt.upstreams, tt.listeners, tt.metrics), func(t *testing.T) {
			c := Config{Upstream: loopbackUpstreams(tt.upstreams), MetricsAddr: tt.metrics}
			if got, _ := c.reserve(tt.listeners); got != tt.want {
				t.Errorf("reserve %d, want %d", got, tt.want)
			}
		})
	}
}

// The check itself, at the edges of the limit, and its one line, which
// names the variable, the numbers and what the reserve is made of.
func TestCheckDescriptors(t *testing.T) {
	tests := []struct {
		conns, upstreams int
		limit            uint64
		want             string // "" for no error
	}{
		{1000, 1, 0, ""}, // unknown: nothing checked
		{1000, 1, 1215, ""},
		{1000, 1, 1214, `DNS_TCP_MAX_CONNS="1000": must leave 215 of the process's 1214 file descriptors (ulimit -n) for its other sockets and files (upstreams 1×20, UDP listeners 2, metrics 65, closing connections 64, fixed 64): at most 999, or raise the limit`},
		{1, 1, 216, ""},
		{1, 1, 215, `DNS_TCP_MAX_CONNS="1": must leave 215 of the process's 215 file descriptors (ulimit -n) for its other sockets and files (upstreams 1×20, UDP listeners 2, metrics 65, closing connections 64, fixed 64): none fit, or raise the limit`},
		{300, 12, 600, `DNS_TCP_MAX_CONNS="300": must leave 435 of the process's 600 file descriptors (ulimit -n) for its other sockets and files (upstreams 12×20, UDP listeners 2, metrics 65, closing connections 64, fixed 64): at most 165, or raise the limit`},
		{100000, 16, 1 << 20, ""},
	}
	for _, tt := range tests {
		c := Config{TCPMaxConns: tt.conns, Upstream: loopbackUpstreams(tt.upstreams), MetricsAddr: "127.0.0.1:9398"}
		err := c.checkDescriptors(tt.limit, 2)
		if got := fmt.Sprint(err); (tt.want == "" && err != nil) || (tt.want != "" && got != tt.want) {
			t.Errorf("%d connections, %d upstreams, limit %d: %v, want %q", tt.conns, tt.upstreams, tt.limit, err, tt.want)
		}
	}
}

// A default cap that does not fit is lowered to what does, and the log
// says what is kept; a limit that holds no more than the reserve leaves
// nothing to lower it to: the error stands.
func TestFitDescriptorsLowersTheDefault(t *testing.T) {
	c := Config{TCPMaxConns: 1000, Upstream: loopbackUpstreams(12), MetricsAddr: "off"}
	if err := c.fitDescriptors(600, 2, false); err != nil {
		t.Fatal(err)
	}
	if c.TCPMaxConns != 600-370 {
		t.Fatalf("lowered to %d, want %d", c.TCPMaxConns, 600-370)
	}
	want := "DNS_TCP_MAX_CONNS: the default, 1000, lowered to 230: the process may open 600 file descriptors (ulimit -n) and keeps 370 for its other sockets and files"
	if got := c.loweredWarning(); got != want {
		t.Errorf("warning %q\nwant    %q", got, want)
	}
	d := Config{TCPMaxConns: 1000, Upstream: loopbackUpstreams(12), MetricsAddr: "off"}
	if err := d.fitDescriptors(370, 2, false); err == nil {
		t.Errorf("a limit of 370, the whole reserve with 12 upstreams, accepted with %d connections", d.TCPMaxConns)
	}
	e := Config{TCPMaxConns: 1000, Upstream: loopbackUpstreams(12), MetricsAddr: "off"}
	if err := e.fitDescriptors(600, 2, true); err == nil {
		t.Errorf("a cap the operator set that does not fit accepted")
	}
}
