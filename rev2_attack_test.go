package main

import (
	"testing"
	"time"
)

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
