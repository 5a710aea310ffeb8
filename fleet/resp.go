package fleet

// What Redis sends is read through a guard before the client sees it. The
// client sizes what it allocates by the length a reply's header announces,
// before it reads one element: a header of 10^9 elements (from a hostile or
// wrong server, or anyone on the path of a plain redis:// link) is a fatal
// out of memory that no recover catches. The limiter's replies are tiny —
// the lease is an array of two integers, the handshake a map of about seven
// pairs, a script's digest 40 bytes — so the guard follows the RESP framing
// and fails the read (an error: the call fails and the instance goes local,
// as on any Redis failure) at any header above a small cap:
//
//   - an aggregate (* % ~ > |) of more than maxRESPElements elements;
//   - a bulk string (= ! $) of more than maxRESPBulk bytes;
//   - a line (a header or a simple reply) longer than maxRESPBulk bytes, a
//     length that is not a number or a negative other than -1, or a type
//     byte RESP does not have.
//
// It keeps its place across reads split at any byte, and skips a bulk
// string's payload (its length and the CRLF), so payload bytes are never
// read as headers. Once failed, every later read fails.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
)

const (
	// maxRESPElements is the most elements an aggregate header may announce.
	maxRESPElements = 64
	// maxRESPBulk is the longest bulk string, and the longest line, accepted.
	maxRESPBulk = 64 << 10
)

// errRESP is what the error of a read the guard failed Is.
var errRESP = errors.New("fleet: reply from redis refused")

// respError is a refusal and its reason. It matches errRESP through Is
// rather than Unwrap: the client unwraps a failed handshake's error once,
// which would drop the reason.
type respError struct{ why string }

// Error reads like "fleet: reply from redis refused: a '*' header over 64".
func (e *respError) Error() string { return errRESP.Error() + ": " + e.why }

// Is reports whether target is errRESP.
func (e *respError) Is(target error) bool { return target == errRESP }

// respState is where the guard is in the stream.
type respState uint8

const (
	respType    respState = iota // the next byte starts a reply: its type
	respLine                     // inside a header or simple reply, until LF
	respPayload                  // inside a bulk string's payload and CRLF
)

// respGuard follows the framing of a RESP stream, one read at a time.
type respGuard struct {
	state  respState
	kind   byte  // the type byte of the line being read
	line   int   // bytes of the line read so far
	n      int64 // the length read so far from the line
	digits int   // its digits
	neg    bool  // a '-' came first
	cr     bool  // the line's CR came
	skip   int64 // payload bytes (CRLF included) still to come
	err    error // sticky: the first refusal
}

// respLimit is the most a header of type kind may announce; counted is
// false for a type whose line carries no length, and limit is -1 for a byte
// that is no RESP type.
func respLimit(kind byte) (limit int64, counted bool) {
	switch kind {
	case '*', '%', '~', '>', '|':
		return maxRESPElements, true
	case '$', '=', '!':
		return maxRESPBulk, true
	case '+', '-', ':', ',', '_', '#', '(':
		return 0, false
	}
	return -1, false
}

// scan follows p, the next bytes of the stream, and returns the refusal if
// any header in it breaks the caps.
func (g *respGuard) scan(p []byte) error {
	if g.err != nil {
		return g.err
	}
	for i := 0; i < len(p); i++ {
		switch g.state {
		case respPayload:
			k := min(int64(len(p)-i), g.skip)
			g.skip -= k
			i += int(k) - 1
			if g.skip == 0 {
				g.state = respType
			}
		case respType:
			g.kind, g.line, g.n, g.digits, g.neg, g.cr = p[i], 0, 0, 0, false, false
			if limit, _ := respLimit(g.kind); limit < 0 {
				return g.fail("unknown type byte %q", g.kind)
			}
			g.state = respLine
		case respLine:
			if err := g.lineByte(p[i]); err != nil {
				return err
			}
		}
	}
	return nil
}

// lineByte takes one byte of a header or simple line.
func (g *respGuard) lineByte(c byte) error {
	g.line++
	if g.line > maxRESPBulk {
		return g.fail("a %q line longer than %d bytes", g.kind, maxRESPBulk)
	}
	limit, counted := respLimit(g.kind)
	if !counted {
		if c == '\n' {
			g.state = respType
		}
		return nil
	}
	switch {
	case g.cr && c == '\n':
		return g.endHeader()
	case g.cr:
		return g.fail("a %q header not ended by CRLF", g.kind)
	case c == '\r':
		g.cr = true
	case c == '-' && g.digits == 0 && !g.neg:
		g.neg = true
	case c >= '0' && c <= '9':
		g.n = g.n*10 + int64(c-'0')
		g.digits++
		if g.n > limit {
			return g.fail("a %q header over %d", g.kind, limit)
		}
	default:
		return g.fail("a %q header with %q in its length", g.kind, c)
	}
	return nil
}

// endHeader acts on a complete length header.
func (g *respGuard) endHeader() error {
	switch {
	case g.digits == 0:
		return g.fail("a %q header without a length", g.kind)
	case g.neg && g.n != 1:
		return g.fail("a %q header of -%d", g.kind, g.n)
	case g.neg: // a null: nothing follows
		g.state = respType
	case g.kind == '$' || g.kind == '=' || g.kind == '!':
		g.state, g.skip = respPayload, g.n+2
	default: // an aggregate: its elements follow, each with its own header
		g.state = respType
	}
	return nil
}

// fail records and returns the refusal.
func (g *respGuard) fail(format string, args ...any) error {
	g.err = &respError{why: fmt.Sprintf(format, args...)}
	return g.err
}

// guardedConn reads its connection through a respGuard. The client reads a
// connection from one goroutine at a time.
type guardedConn struct {
	net.Conn
	guard respGuard
}

// Read reads from the connection and fails, now and from then on, once the
// guard refuses what came.
func (c *guardedConn) Read(p []byte) (int, error) {
	if c.guard.err != nil {
		return 0, c.guard.err
	}
	n, err := c.Conn.Read(p)
	if gerr := c.guard.scan(p[:n]); gerr != nil {
		return 0, gerr
	}
	return n, err
}

// guardedSysConn is a guardedConn over a connection with a file descriptor
// (plain TCP): the client's health check peeks at the socket (MSG_PEEK,
// nothing consumed) before it reuses a pooled connection, and finds one
// Redis closed without a failed call.
type guardedSysConn struct {
	*guardedConn
	sys syscall.Conn
}

// SyscallConn returns the underlying connection's raw descriptor.
func (c guardedSysConn) SyscallConn() (syscall.RawConn, error) { return c.sys.SyscallConn() }

// guardDialer wraps every connection dial makes in a guard.
func guardDialer(dial func(context.Context, string, string) (net.Conn, error)) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		g := &guardedConn{Conn: conn}
		if sys, ok := conn.(syscall.Conn); ok {
			return guardedSysConn{guardedConn: g, sys: sys}, nil
		}
		return g, nil
	}
}
