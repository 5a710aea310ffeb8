package fleet

import (
	"errors"
	"testing"
)

// respGuard passes every reply the limiter gets, split at any byte, and
// fails on a size past its limits, wherever the header falls: a bulk's
// payload is skipped, never read as a header.
func TestRESPScan(t *testing.T) {
	for _, tt := range []struct {
		name   string
		stream string
		ok     bool
	}{
		{"the lease reply", "*2\r\n:12\r\n:900\r\n", true},
		{"OK and an error", "+OK\r\n-NOSCRIPT No matching script. Please use EVAL.\r\n", true},
		{"a script hash", "$40\r\n0123456789abcdef0123456789abcdef01234567\r\n", true},
		{"a bulk holding a huge array header as payload", "$14\r\n*1000000000\r\n\r\n:1\r\n", true},
		{"a null bulk and a null array", "$-1\r\n*-1\r\n", true},
		{"a HELLO map", "%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$5\r\nproto\r\n:3\r\n", true},
		{"a huge array", "*1000000000\r\n", false},
		{"a huge map", "%100000000\r\n", false},
		{"a huge set", "~65\r\n", false},
		{"a huge push", ">1000\r\n", false},
		{"a huge bulk", "$1000000000\r\n", false},
		{"a huge verbatim string", "=70000\r\n", false},
		{"a huge array after a bulk", "$3\r\nabc\r\n*99999\r\n", false},
		{"a size that is no number", "*12a\r\n", false},
		{"a size past any int", "*99999999999999999999999999\r\n", false},
		{"a header that never ends", "*" + string(make([]byte, 100)), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for cut := 0; cut <= len(tt.stream); cut++ { // two reads, split at every byte
				var s respScan
				err := s.feed([]byte(tt.stream[:cut]))
				if err == nil {
					err = s.feed([]byte(tt.stream[cut:]))
				}
				if (err == nil) != tt.ok {
					t.Fatalf("split at %d: %v, want ok %v", cut, err, tt.ok)
				}
				if err != nil && !errors.Is(err, errRESPTooLarge) {
					t.Fatalf("split at %d: %v", cut, err)
				}
			}
			var s respScan // and one byte at a time
			var err error
			for i := 0; i < len(tt.stream) && err == nil; i++ {
				err = s.feed([]byte{tt.stream[i]})
			}
			if (err == nil) != tt.ok {
				t.Fatalf("byte by byte: %v, want ok %v", err, tt.ok)
			}
		})
	}
}
