package fleet

import (
	"errors"
	"net"
	"strconv"
)

// A Redis reply states its size before its content: an array "*N", a map
// "%N", a bulk string "$N". The client sizes what it allocates by that N
// before reading a single element, so one line from whatever answers on the
// Redis port ("*1000000000") made it allocate gigabytes and the process
// died of it (TestAttackHugeArrayLengthDoesNotCrash): a compromised Redis,
// a wrong port, or anyone on the path of a plain redis:// link could kill
// every instance of the fleet. Every connection to Redis therefore reads
// through respGuard, which follows the replies' framing and fails the read
// on a size past what the limiter's few commands ever get back. The client
// then sees a broken connection, and the instance falls back to its local
// share, as on any Redis failure.

const (
	maxRESPElements = 64       // an array, map, set or push: the lease reply is 2 integers, HELLO's map 7 pairs
	maxRESPBulk     = 64 << 10 // a bulk string, verbatim string or blob error: error texts and script hashes
	maxRESPHeader   = 32       // a header line's bytes: a type and a number
)

// errRESPTooLarge fails a read of a reply larger than respGuard allows.
var errRESPTooLarge = errors.New("fleet: Redis reply larger than the limiter takes")

// respGuard is a connection to Redis whose reads are checked as they come.
type respGuard struct {
	net.Conn
	scan respScan
}

func (g *respGuard) Read(p []byte) (int, error) {
	n, err := g.Conn.Read(p)
	if serr := g.scan.feed(p[:n]); serr != nil {
		g.Conn.Close()
		return 0, serr
	}
	return n, err
}

// respScan follows RESP framing across reads split anywhere: the header
// line of each reply and element, and the payload of a bulk, skipped, so
// that no payload byte is ever read as a header. The zero value is at the
// start of a reply.
type respScan struct {
	skip   int    // payload bytes of a bulk, and its CRLF, still to pass
	inLine bool   // inside a line: its first byte was the type
	kind   byte   // the line's type
	num    []byte // a sized type's digits so far (at most maxRESPHeader)
	buf    [maxRESPHeader]byte
}

// feed takes the next bytes of the stream, and fails on a size past the
// limits or a sized header that does not read as a number.
func (s *respScan) feed(b []byte) error {
	for len(b) > 0 {
		if s.skip > 0 {
			k := min(s.skip, len(b))
			s.skip -= k
			b = b[k:]
			continue
		}
		c := b[0]
		b = b[1:]
		if !s.inLine {
			s.inLine, s.kind, s.num = true, c, s.buf[:0]
			continue
		}
		if c != '\n' {
			if len(s.num) < maxRESPHeader {
				s.num = append(s.num, c)
			} else if sized(s.kind) {
				return errRESPTooLarge // no size takes that many digits
			} // a long simple string or error: only its first bytes are kept, the client bounds its lines
			continue
		}
		s.inLine = false
		if err := s.header(); err != nil {
			return err
		}
	}
	return nil
}

// sized reports whether a line of type kind states a size.
func sized(kind byte) bool {
	switch kind {
	case '*', '%', '~', '>', '|', '$', '=', '!':
		return true
	}
	return false
}

// header checks a whole header line (its type in kind, the rest in num, up
// to its '\r').
func (s *respScan) header() error {
	var limit int
	switch s.kind {
	case '*', '%', '~', '>', '|':
		limit = maxRESPElements
	case '$', '=', '!':
		limit = maxRESPBulk
	default:
		return nil // a line of its own: a simple string, an error, an integer...
	}
	digits := s.num
	if len(digits) > 0 && digits[len(digits)-1] == '\r' {
		digits = digits[:len(digits)-1]
	}
	n, err := strconv.Atoi(string(digits))
	switch {
	case err != nil:
		return errRESPTooLarge
	case n < 0:
		return nil // a null
	case n > limit:
		return errRESPTooLarge
	}
	if s.kind == '$' || s.kind == '=' || s.kind == '!' {
		s.skip = n + 2
	}
	return nil
}
