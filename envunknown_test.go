package main

import (
	"slices"
	"testing"
)

// A DNS_ variable that names no setting is reported, with the nearest
// setting's name when it is a few letters away; a setting's own name, a
// variable without the prefix and Kubernetes' service variables are not.
func TestUnknownVariables(t *testing.T) {
	got := unknownVariables([]string{
		"DNS_BREAKER_TRESHOLD=50",    // a letter missing
		"DNS_UPSTREAM_TIMOUT=1s",     // another
		"DNS_RATE_LIMIT=10",          // ours
		"DNS_SERVICE_HOST=10.0.0.10", // Kubernetes, for a service named dns
		"DNS_SERVICE_PORT_DNS_TCP=53",
		"DNS_PORT=udp://10.0.0.10:53",
		"DNS_PORT_53_UDP_PROTO=udp",
		// Kubernetes, for a service named dns-cache in the same namespace.
		"DNS_CACHE_SERVICE_HOST=10.0.0.11",
		"DNS_CACHE_SERVICE_PORT=53",
		"DNS_CACHE_SERVICE_PORT_DNS_UDP=53",
		"DNS_CACHE_PORT=udp://10.0.0.11:53",
		"DNS_CACHE_PORT_53_UDP=udp://10.0.0.11:53",
		"DNS_CACHE_PORT_53_UDP_PROTO=udp",
		"DNS_CACHE_PORT_53_UDP_PORT=53",
		"DNS_CACHE_PORT_53_UDP_ADDR=10.0.0.11",
		// Shaped like them, but a setting someone meant: still warned.
		"DNS_LISTEN_PORT=5353",
		"DNS_METRICS_PORT=9153",
		"DNS_SOMETHING_ELSE_ENTIRELY=1", // no setting near it
		"PATH=/usr/bin",
		"DNS_LISTEN", // no '=': still a name
	})
	want := [][2]string{
		{"DNS_BREAKER_TRESHOLD", "DNS_BREAKER_THRESHOLD"},
		{"DNS_UPSTREAM_TIMOUT", "DNS_UPSTREAM_TIMEOUT"},
		{"DNS_LISTEN_PORT", ""},
		{"DNS_METRICS_PORT", ""},
		{"DNS_SOMETHING_ELSE_ENTIRELY", ""},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("unknownVariables = %q\nwant %q", got, want)
	}
}
