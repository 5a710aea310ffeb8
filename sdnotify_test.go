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

// nextNotice returns the next datagram on c, failing the test if run
// exits first (its code is sent on exit) or after 10 s.
func nextNotice(t *testing.T, c *net.UnixConn, exit chan int, logs *syncBuffer, what string) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		buf := make([]byte, 4096)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := c.Read(buf)
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- string(buf[:n])
	}()
	select {
	case msg := <-got:
		if strings.HasPrefix(msg, "error: ") {
			t.Fatalf("waiting for %s on NOTIFY_SOCKET: %s; log:\n%s", what, msg, logs.String())
		}
		return msg
	case code := <-exit:
		// A notice sent before the exit is in the socket already: the
		// read returns it, or fails at its deadline.
		msg := <-got
		if strings.HasPrefix(msg, "error: ") {
			t.Fatalf("run exited %d before %s: %s", code, what, logs.String())
		}
		exit <- code // for the caller's own check
		return msg
	}
}

// noticeValue returns the value of key in a notice's "KEY=value" lines.
func noticeValue(msg, key string) (string, bool) {
	for _, line := range strings.Split(msg, "\n") {
		if v, ok := strings.CutPrefix(line, key+"="); ok {
			return v, true
		}
	}
	return "", false
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
			setEnv(t, map[string]string{"DNS_LISTEN": "127.0.0.1:0", "DNS_UPSTREAM": up.Addr(), "DNS_METRICS_ADDR": "off",
				"NOTIFY_SOCKET": tc.socket})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			exit := make(chan int, 1)
			var logs syncBuffer
			go func() { exit <- run(ctx, nil, io.Discard, &logs, nil) }()

			msg := nextNotice(t, notify, exit, &logs, "READY=1")
			if v, _ := noticeValue(msg, "READY"); v != "1" {
				t.Fatalf("first notice %q, want READY=1 in it", msg)
			}
			status, _ := noticeValue(msg, "STATUS")
			listen, ok := strings.CutPrefix(status, "answering on ")
			if !ok {
				t.Fatalf("first notice %q: want STATUS=answering on <address>", msg)
			}
			// READY=1 means answering: the query right after it is answered.
			if r, err := tryAsk("udp", listen, query("www.example.com", 1), 2*time.Second); err != nil || r.Rcode != 0 {
				t.Fatalf("query right after READY=1: %v, %v", r, err)
			}
			cancel()
			if msg := nextNotice(t, notify, exit, &logs, "STOPPING=1"); !strings.Contains(msg+"\n", "STOPPING=1\n") {
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
	setEnv(t, map[string]string{"DNS_LISTEN": "127.0.0.1:0", "DNS_UPSTREAM": up.Addr(), "DNS_METRICS_ADDR": "off",
		"NOTIFY_SOCKET": filepath.Join(t.TempDir(), "nobody")})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan *app, 1)
	exit := make(chan int, 1)
	var logs syncBuffer
	go func() { exit <- run(ctx, nil, io.Discard, &logs, func(a *app) { ready <- a }) }()
	var a *app
	select {
	case a = <-ready:
	case code := <-exit:
		t.Fatalf("run exited %d: %s", code, logs.String())
	case <-time.After(10 * time.Second):
		t.Fatal("run did not start listening")
	}
	waitFor(t, "the warning about NOTIFY_SOCKET", func() bool { return strings.Contains(logs.String(), "NOTIFY_SOCKET") })
	if r, err := tryAsk("udp", a.addr(), query("www.example.com", 1), 2*time.Second); err != nil || r.Rcode != 0 {
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
