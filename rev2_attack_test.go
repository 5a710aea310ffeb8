package main

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"dnsproxi/exercises/fakeupstream"
)

// A transient lookup failure exits 1 so that the unit restarts the proxy
// (TestAttackTransientLookupFailureExitsAsConfigError), but only when
// DNS_UPSTREAM names one host: with a list, the failing entry's error is
// made by entryError, which knows no lookupError, and the same SERVFAIL
// ends start-up with exit 2, which the unit (RestartPreventExitStatus=2)
// never restarts.
func TestAttackTransientLookupFailureInAListExitsAsConfigError(t *testing.T) {
	resolver := startUpstream(t)
	resolver.SetMode(fakeupstream.ServFail)
	saved := net.DefaultResolver
	net.DefaultResolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, resolver.Addr()) // never the system's resolver
	}}
	t.Cleanup(func() { net.DefaultResolver = saved })
	first, second := startUpstream(t), startUpstream(t)
	_, port, _ := net.SplitHostPort(second.Addr())
	setEnv(t, map[string]string{"DNS_LISTEN": "127.0.0.1:0", "DNS_METRICS_ADDR": "off",
		"DNS_UPSTREAM": first.Addr() + ",upstream.dnsproxi.test.:" + port})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs syncBuffer
	exit := make(chan int, 1)
	go func() { exit <- run(ctx, nil, io.Discard, &logs, func(*app) { cancel() }) }()
	select {
	case code := <-exit:
		if resolver.Total() == 0 {
			t.Fatalf("the lookup never reached the fake resolver (exit %d): %s", code, logs.String())
		}
		if code == 2 {
			t.Fatalf("a lookup answered SERVFAIL for the second upstream of a list ends start-up with exit 2, never restarted: %s", strings.TrimSpace(logs.String()))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return")
	}
}

// readEnv looks every field of Config up as "DNS_" + its envconfig tag,
// the unexported ones too, whose tag is empty: a variable named "DNS_"
// (an empty suffix, as a templated unit or a shell typo leaves) is decoded
// into an unexported field, and reflect panics instead of the one-line
// error and exit 2.
func TestAttackBareDNSPrefixVariablePanics(t *testing.T) {
	lookup := func(k string) (string, bool) {
		if k == "DNS_" {
			return "1", true
		}
		return "", false
	}
	done := make(chan any, 1)
	go func() {
		defer func() { done <- recover() }()
		readEnv(new(Config), lookup)
	}()
	select {
	case p := <-done:
		if p != nil {
			t.Fatalf("DNS_=1 panics while reading the configuration: %v", p)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("readEnv did not return")
	}
}
