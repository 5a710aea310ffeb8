package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
)

// An access list that lets every address of a family query is an open
// resolver on a public address, however it is written: the start-up log
// warns for any, and for a list holding 0.0.0.0/0 or ::/0 (which it did
// not: found by a no-context review). A query log whose file cannot be
// opened is a configuration error: one line naming DNS_QUERY_LOG, exit 2
// (it was 1).
func TestStartupWarnsOfAnOpenAccessList(t *testing.T) {
	tests := []struct {
		allow string
		warn  bool
	}{
		{"any", true},
		{"0.0.0.0/0,::/0", true},
		{"0.0.0.0/0", true},
		{"::/0", true},
		{"local", false},
		{"127.0.0.0/8,::1", false},
	}
	for _, tt := range tests {
		t.Run(tt.allow, func(t *testing.T) {
			setEnv(t, map[string]string{"DNS_UPSTREAM": "127.0.0.1:53", "DNS_LISTEN": "127.0.0.1:0", "DNS_METRICS_ADDR": "off",
				"DNS_ALLOW": tt.allow})
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // it starts, warns or not, and stops at once
			var stdout, stderr syncBuffer
			if code := run(ctx, nil, &stdout, &stderr, nil); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			if got := strings.Contains(stderr.String(), "open resolver"); got != tt.warn {
				t.Fatalf("warned %v, want %v:\n%s", got, tt.warn, stderr.String())
			}
		})
	}
}

func TestQueryLogThatCannotBeOpenedIsAConfigurationError(t *testing.T) {
	dir := t.TempDir()
	for _, path := range []string{
		dir + "/missing/queries.log",
		// A newline in the path stayed raw in the open error's text: two
		// lines on stderr, where the rule is one.
		dir + "/missing\nline/queries.log",
	} {
		t.Run(path, func(t *testing.T) {
			setEnv(t, map[string]string{"DNS_UPSTREAM": "127.0.0.1:53", "DNS_LISTEN": "127.0.0.1:0", "DNS_METRICS_ADDR": "off",
				"DNS_QUERY_LOG": path})
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			var stdout, stderr syncBuffer
			code := run(ctx, nil, &stdout, &stderr, nil)
			out := stderr.String()
			if code != 2 || strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, fmt.Sprintf("dnsproxi: DNS_QUERY_LOG=%q: ", path)) {
				t.Fatalf("exit %d, stderr %q; want exit 2 and one line naming DNS_QUERY_LOG", code, out)
			}
		})
	}
}
