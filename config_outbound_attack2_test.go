package main

import (
	"strings"
	"testing"
)

// TestAttackStartupErrorShowsRedisPassword: a password written into
// DNS_UPSTREAM_RATE_LIMIT_REDIS without percent-encoding, holding '/'
// (as base64 passwords do), '#' or '?', makes the URL unparsable; the
// start-up error (one line on stderr, in the journal) must still not show
// it. fleet.RedactURL ends the user information at the first '/', '?' or
// '#', finds no '@' before it and leaves the URL as it was.
func TestAttackStartupErrorShowsRedisPassword(t *testing.T) {
	for _, c := range []struct{ url, tail string }{
		{"redis://default:Zm9v/YmFyYmF6cXV4@10.0.0.5:6379/0", "YmFyYmF6cXV4"},
		{"redis://:s3cr#etvalue@10.0.0.5:6379", "etvalue"},
		{"redis://:s3cr?etvalue@10.0.0.5:6379", "etvalue"},
	} {
		t.Run(c.url, func(t *testing.T) {
			setEnv(t, withUpstream(map[string]string{"DNS_UPSTREAM_RATE_LIMIT": "300", "DNS_UPSTREAM_RATE_LIMIT_REDIS": c.url}))
			_, err := loadConfig()
			if err == nil {
				t.Fatal("accepted")
			}
			if strings.Contains(err.Error(), c.tail) {
				t.Errorf("the start-up error shows the password: %v", err)
			}
		})
	}
}
