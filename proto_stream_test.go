package main

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// What a TCP client gets when its stream ends oddly after whole queries
// (RFC 7766 §6.2.1: the server owes it the answers): more queries
// pipelined than the server takes at once (dnsserver.DefaultTCPPipeline),
// forwarded ones mixed with ones the proxy answers itself (FORMERR to no
// question, NOTIMP to UPDATE, BADVERS to EDNS version 1), then a half-close;
// or whole queries followed by a zero length prefix (the connection is
// closed without reading on), or by a length prefix the stream ends before
// fulfilling. Every whole query is answered, with its ID and the rcode it
// is due, then the proxy's FIN. These passed when written: they guard the
// README's "a closed connection gets the answers written to it" for the
// ways a client can end its side.
func TestProtoTCPStreamEndsStillAnswerWholeQueries(t *testing.T) {
	up := startUpstream(t)
	a := startProxy(t, testConfig(up.Addr()), nil)
	www := []byte{3, 'w', 'W', 'w', 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 0}
	ednsV1 := []byte{0, 0, 41, 0x04, 0xd0, 0, 1, 0, 0, 0, 0} // size 1232, version 1
	// query i and the rcode it is due: forwarded, FORMERR, NOTIMP, BADVERS in turn.
	query := func(i int) ([]byte, int) {
		switch i % 4 {
		case 1:
			return rawHeader(uint16(i), 0, 0), dns.RcodeFormatError
		case 2:
			return protoQuery(uint16(i), 5<<11, www, dns.TypeSOA), dns.RcodeNotImplemented
		case 3:
			q := protoQuery(uint16(i), wire.FlagRD, www, dns.TypeA)
			wire.SetCounts(q, 1, 0, 0, 1)
			return append(q, ednsV1...), dns.RcodeBadVers
		}
		return protoQuery(uint16(i), wire.FlagRD, www, dns.TypeA), dns.RcodeSuccess
	}
	tests := []struct {
		name    string
		queries int
		tail    []byte // after the whole queries
	}{
		{"100 pipelined then half-close", 100, nil},
		{"zero length prefix", 8, []byte{0, 0}},
		{"length beyond the data, then half-close", 8, []byte{0, 100, 0x12, 0x34, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stream []byte
			want := map[uint16]int{}
			for i := range tt.queries {
				q, rcode := query(i)
				stream = binary.BigEndian.AppendUint16(stream, uint16(len(q)))
				stream = append(stream, q...)
				want[uint16(i)] = rcode
			}
			stream = append(stream, tt.tail...)
			c, err := net.DialTimeout("tcp", a.addr(), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write(stream); err != nil {
				t.Fatal(err)
			}
			if err := c.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			for n := 0; len(want) > 0; n++ {
				var l [2]byte
				if _, err := io.ReadFull(c, l[:]); err != nil {
					t.Fatalf("after %d answers of %d: %v", n, tt.queries, err)
				}
				b := make([]byte, binary.BigEndian.Uint16(l[:]))
				if _, err := io.ReadFull(c, b); err != nil {
					t.Fatal(err)
				}
				r := new(dns.Msg)
				if err := r.Unpack(b); err != nil {
					t.Fatalf("answer %x does not parse: %v", b, err)
				}
				rcode, ok := want[r.Id]
				if !ok || r.Rcode != rcode {
					t.Fatalf("answer to ID %d: %s; want %v (due: %v)", r.Id, dns.RcodeToString[r.Rcode], rcode, ok)
				}
				delete(want, r.Id)
			}
			if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
				t.Fatalf("after the last answer: %d bytes, %v; want EOF (the proxy's FIN)", n, err)
			}
		})
	}
}
