package main

import (
	"context"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// listenNotify opens the socket a service manager would pass in
// NOTIFY_SOCKET: at path, or in the abstract namespace when path starts
// with "@".
func listenNotify(t *testing.T, path string) *net.UnixConn {
	t.Helper()
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// nextNotice returns the next datagram on c, failing the test after 10 s.
func nextNotice(t *testing.T, c *net.UnixConn, what string) string {
	t.Helper()
	buf := make([]byte, 4096)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("waiting for %s on NOTIFY_SOCKET: %v", what, err)
	}
	return string(buf[:n])
}

// Under a service manager (systemd's Type=notify) the proxy says READY=1
// once it answers queries, and STOPPING=1 when a signal starts its drain.
// Until READY=1 the manager neither starts the units ordered after it nor
// runs ExecReload: a SIGHUP sent before the runtime has taken the signal
// would end the process. Both a socket path and an abstract name work.
func TestServiceManagerHearsReadyAndStopping(t *testing.T) {
	for _, tc := range []struct{ name, socket string }{
		{"path", filepath.Join(t.TempDir(), "notify")},
		{"abstract", "@dnsproxi-test-notify-" + strings.ReplaceAll(t.Name(), "/", "-")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			notify := listenNotify(t, tc.socket)
			up := startUpstream(t)
			listen := freeUDPAddr(t)
			setEnv(t, map[string]string{"DNS_LISTEN": listen, "DNS_UPSTREAM": up.Addr(), "DNS_METRICS_ADDR": "off",
				"NOTIFY_SOCKET": tc.socket})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			exit := make(chan int, 1)
			var logs syncBuffer
			go func() { exit <- run(ctx, nil, io.Discard, &logs, nil) }()

			msg := nextNotice(t, notify, "READY=1")
			if !strings.Contains("\n"+msg+"\n", "\nREADY=1\n") {
				t.Fatalf("first notice %q, want READY=1 in it", msg)
			}
			// READY=1 means answering: the query right after it is answered.
			if r, err := tryAsk("udp", listen, query("www.example.com", 1), 2*time.Second); err != nil || r.Rcode != 0 {
				t.Fatalf("query right after READY=1: %v, %v", r, err)
			}
			cancel()
			if msg := nextNotice(t, notify, "STOPPING=1"); !strings.Contains("\n"+msg+"\n", "\nSTOPPING=1\n") {
				t.Fatalf("notice after the stop signal %q, want STOPPING=1", msg)
			}
			select {
			case code := <-exit:
				if code != 0 {
					t.Fatalf("exit %d, want 0: %s", code, logs.String())
				}
			case <-time.After(10 * time.Second):
				t.Fatal("run did not return")
			}
		})
	}
}

// A NOTIFY_SOCKET that nobody listens on costs a warning, not the service.
func TestUnreachableNotifySocketOnlyWarns(t *testing.T) {
	up := startUpstream(t)
	listen := freeUDPAddr(t)
	setEnv(t, map[string]string{"DNS_LISTEN": listen, "DNS_UPSTREAM": up.Addr(), "DNS_METRICS_ADDR": "off",
		"NOTIFY_SOCKET": filepath.Join(t.TempDir(), "nobody")})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan *app, 1)
	exit := make(chan int, 1)
	var logs syncBuffer
	go func() { exit <- run(ctx, nil, io.Discard, &logs, func(a *app) { ready <- a }) }()
	select {
	case <-ready:
	case code := <-exit:
		t.Fatalf("run exited %d: %s", code, logs.String())
	case <-time.After(10 * time.Second):
		t.Fatal("run did not start listening")
	}
	waitFor(t, "the warning about NOTIFY_SOCKET", func() bool { return strings.Contains(logs.String(), "NOTIFY_SOCKET") })
	if r, err := tryAsk("udp", listen, query("www.example.com", 1), 2*time.Second); err != nil || r.Rcode != 0 {
		t.Fatalf("query: %v, %v", r, err)
	}
	cancel()
	select {
	case code := <-exit:
		if code != 0 {
			t.Fatalf("exit %d, want 0", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return")
	}
}

// freeUDPAddr returns a loopback UDP address free a moment ago.
func freeUDPAddr(t *testing.T) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().String()
}
