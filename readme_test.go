package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestReadmeClientRateLimitHelpNamesTCP holds dnsproxi -h to what the
// per-client gate does: it keeps a table for UDP and one for TCP
// (README, "The per-client gate"), and a second TCP query from a client
// over DNS_CLIENT_RATE_LIMIT=0.01,1 is REFUSED as client_limited. An
// operator reading "per-client gate over UDP" in -h would take TCP clients
// to be exempt, and a TCP-only downstream resolver to need no
// DNS_CLIENT_EXEMPT.
func TestReadmeClientRateLimitHelpNamesTCP(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, &out, &errOut, nil); code != 0 {
		t.Fatalf("-h exit %d", code)
	}
	var line string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "DNS_CLIENT_RATE_LIMIT ") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("-h lists no DNS_CLIENT_RATE_LIMIT:\n%s", out.String())
	}
	if !strings.Contains(line, "TCP") {
		t.Errorf("-h says the per-client gate is for UDP alone; it gates TCP too, with a table of its own:\n%s", line)
	}
}

// dnsproxi -h names the two variables outside DNS_* that change what the
// proxy does: GOMAXPROCS (unset, the thread count follows the load; set,
// it is kept: procs.go) and NOTIFY_SOCKET (systemd's readiness).
func TestReadmeHelpNamesTheOtherVariables(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, &out, &errOut, nil); code != 0 {
		t.Fatalf("-h exit %d", code)
	}
	for _, name := range []string{"GOMAXPROCS", "NOTIFY_SOCKET"} {
		if !strings.Contains(out.String(), "\n  "+name+" ") {
			t.Errorf("-h does not name %s:\n%s", name, out.String())
		}
	}
}
