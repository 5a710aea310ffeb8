package fleet

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// respCases are streams the guard must pass or refuse, whole or split.
var respCases = []struct {
	name   string
	stream string
	ok     bool
}{
	{"lease reply", "*2\r\n:5\r\n:3\r\n", true},
	{"handshake map", "%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.2.4\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:12\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster\r\n$7\r\nmodules\r\n*0\r\n", true},
	{"simple replies", "+OK\r\n-NOSCRIPT No matching script.\r\n:-12\r\n,3.5\r\n_\r\n#t\r\n(123456789012345678901234567890\r\n", true},
	{"nulls", "$-1\r\n*-1\r\n", true},
	{"digest", "$40\r\n" + strings.Repeat("a", 40) + "\r\n", true},
	{"bulk holding a huge header", "$15\r\n*1000000000\r\n12\r\n*1\r\n:1\r\n", true},
	{"bulk holding CRLFs and types", "$8\r\n\r\n$99\r\n*\r\n+OK\r\n", true},
	{"aggregates at the cap", "*64\r\n" + strings.Repeat(":1\r\n", 64), true},
	{"bulk at the cap", "$65536\r\n" + strings.Repeat("x", 65536) + "\r\n", true},
	{"huge array", "*1000000000\r\n", false},
	{"huge array after a good reply", "*2\r\n:1\r\n:1\r\n*1000000000\r\n", false},
	{"array over the cap", "*65\r\n", false},
	{"huge map", "%1000000000\r\n", false},
	{"huge set", "~2147483647\r\n", false},
	{"huge push", ">100000\r\n", false},
	{"huge attribute", "|100\r\n", false},
	{"huge bulk", "$1000000000\r\n", false},
	{"bulk over the cap", "$65537\r\n", false},
	{"huge verbatim", "=999999\r\n", false},
	{"huge bulk error", "!999999\r\n", false},
	{"nested huge array", "*1\r\n*1000000000\r\n", false},
	{"overflowing length", "*99999999999999999999999999\r\n", false},
	{"negative other than -1", "*-2\r\n", false},
	{"no length", "$\r\n", false},
	{"letters in the length", "*1x\r\n", false},
	{"streamed bulk", "$?\r\n", false},
	{"unknown type", "X1\r\n", false},
	{"endless simple line", "+" + strings.Repeat("y", maxRESPBulk+1), false},
}

// TestRESPGuard feeds each stream whole, cut in two at every byte, and a
// byte at a time: a split never changes the verdict.
func TestRESPGuard(t *testing.T) {
	for _, c := range respCases {
		t.Run(c.name, func(t *testing.T) {
			feeds := [][]string{{c.stream}}
			for cut := 1; cut < len(c.stream); cut++ {
				if len(c.stream) > 2000 && cut%97 != 0 && cut > 20 && cut < len(c.stream)-20 {
					continue // long streams: every cut near the headers, a sample of the payload
				}
				feeds = append(feeds, []string{c.stream[:cut], c.stream[cut:]})
			}
			if len(c.stream) <= 2000 {
				var bytes []string
				for i := range len(c.stream) {
					bytes = append(bytes, c.stream[i:i+1])
				}
				feeds = append(feeds, bytes)
			}
			for _, parts := range feeds {
				var g respGuard
				var err error
				for _, p := range parts {
					if err = g.scan([]byte(p)); err != nil {
						break
					}
				}
				if c.ok && err != nil {
					t.Fatalf("split %d ways at %d: refused: %v", len(parts), len(parts[0]), err)
				}
				if !c.ok {
					if err == nil {
						t.Fatalf("split %d ways at %d: passed", len(parts), len(parts[0]))
					}
					if !errors.Is(err, errRESP) || !errors.Is(g.scan([]byte("+OK\r\n")), errRESP) {
						t.Fatalf("refusal %v is not errRESP or not sticky", err)
					}
				}
				if c.ok && g.state != respType {
					t.Fatalf("split %d ways at %d: ends in state %d, not at a reply's start", len(parts), len(parts[0]), g.state)
				}
			}
		})
	}
}

// TestGuardedConnFailsTheRead: the connection returns an error, not the
// bytes, once the guard refuses them, and every read after.
func TestGuardedConnFailsTheRead(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	dial := guardDialer(func(context.Context, string, string) (net.Conn, error) { return client, nil })
	conn, err := dial(context.Background(), "tcp", "pipe")
	if err != nil {
		t.Fatal(err)
	}
	go server.Write([]byte("*2\r\n:1\r\n:2\r\n"))
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	n, err := conn.Read(buf)
	if err != nil || string(buf[:n]) != "*2\r\n:1\r\n:2\r\n" {
		t.Fatalf("good reply: %q, %v", buf[:n], err)
	}
	go server.Write([]byte("*1000000000\r\n"))
	if n, err := conn.Read(buf); n != 0 || !errors.Is(err, errRESP) {
		t.Fatalf("huge header: read %d bytes, err %v; want 0 and errRESP", n, err)
	}
	if n, err := conn.Read(buf); n != 0 || !errors.Is(err, errRESP) {
		t.Fatalf("read after the refusal: %d bytes, err %v; want 0 and errRESP", n, err)
	}
}

// TestOversizedReplySendsTheInstanceLocal: a server that answers every
// command with an array header above the cap (100,000: harmless to a client
// without the guard, so a regression fails here rather than crashing) leaves
// the instance in local mode, the reason being the guard's refusal (its
// detail kept through the client's unwrapping), and each
// call counted as an error.
func TestOversizedReplySendsTheInstanceLocal(t *testing.T) {
	url := hostileRedis(t, "*100000\r\n")
	var first Switch
	l, err := New(Config{URL: url, Rate: 1000, Fallback: 100, Timeout: 200 * time.Millisecond,
		OnSwitch: func(s Switch) {
			if s.From == ModeStarting {
				first = s
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Mode() != ModeLocal || first.Err == nil || !strings.Contains(first.Err.Error(), "refused: a '*' header over 64") {
		t.Fatalf("mode %v, first switch %+v: want local, for the guard's refusal", l.Mode(), first)
	}
	if c := l.RedisCalls(); c.Error != 1 || c.OK != 0 || c.Timeout != 0 {
		t.Fatalf("calls %+v: want one error", c)
	}
	if !l.Allow(1) {
		t.Fatal("the local bucket refused the first query")
	}
}
