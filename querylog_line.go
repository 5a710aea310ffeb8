package main

import (
	"encoding/binary"
	"strconv"
	"time"

	"github.com/miekg/dns"
)

// appendJSON appends e as one line of JSON:
//
//	{"time":"2025-01-02T03:04:05.678901Z","client":"192.0.2.1:53124","name":"www.example.com.","type":"A",
//	 "outcome":"forwarded","rcode":"NOERROR","upstream":"192.0.2.53:53","duration_ms":0.412}
//
// The name is in presentation format: a byte other than a letter, digit or
// printable sign as \DDD, a dot or backslash inside a label with a
// backslash, so no name can forge a field or a line. A query without a
// readable question has "" for name and type; one dropped unanswered has a
// null rcode; one that never reached an upstream an empty upstream.
func (e *logEntry) appendJSON(dst []byte) []byte {
	dst = append(dst, `{"time":"`...)
	dst = e.time.UTC().AppendFormat(dst, time.RFC3339Nano)
	dst = append(dst, `","client":"`...)
	dst = e.client.AppendTo(dst)
	dst = append(dst, `","name":"`...)
	q := e.q[:e.qlen]
	qtype := ""
	if len(q) >= 5 {
		dst = appendName(dst, q[:len(q)-4])
		qtype = typeName(binary.BigEndian.Uint16(q[len(q)-4:]))
	}
	dst = append(dst, `","type":"`...)
	dst = append(dst, qtype...)
	dst = append(dst, `","outcome":"`...)
	dst = append(dst, e.outcome.String()...)
	dst = append(dst, `","rcode":`...)
	if e.rcode == noAnswer {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '"')
		dst = append(dst, rcodeMnemonic(e.rcode)...)
		dst = append(dst, '"')
	}
	dst = append(dst, `,"upstream":"`...)
	dst = appendJSONText(dst, e.upstream)
	dst = append(dst, `","duration_ms":`...)
	dst = strconv.AppendFloat(dst, float64(e.duration.Microseconds())/1000, 'f', -1, 64)
	return append(dst, "}\n"...)
}

// appendName appends the wire-format name in presentation format, escaped
// for a JSON string: the backslash of each escape doubled.
func appendName(dst, name []byte) []byte {
	if len(name) == 0 || name[0] == 0 {
		return append(dst, '.')
	}
	for i := 0; i < len(name) && name[i] != 0; {
		n := int(name[i])
		i++
		if n > 63 || i+n > len(name) {
			return append(dst, `\\?`...) // not a name wire.QuestionEnd lets through
		}
		for _, c := range name[i : i+n] {
			switch {
			case c == '.':
				dst = append(dst, '\\', '\\', c)
			case c == '\\' || c == '"': // escaped in the name, and again in JSON
				dst = append(dst, '\\', '\\', '\\', c)
			case c < '!' || c > '~':
				dst = append(dst, '\\', '\\', '0'+c/100, '0'+c/10%10, '0'+c%10)
			default:
				dst = append(dst, c)
			}
		}
		dst = append(dst, '.')
		i += n
	}
	return dst
}

// appendJSONText appends s, which the operator configured (an upstream's
// address), escaped for a JSON string.
func appendJSONText(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' || c == '"':
			dst = append(dst, '\\', c)
		case c < ' ':
			dst = append(dst, `\u00`...)
			dst = append(dst, "0123456789abcdef"[c>>4], "0123456789abcdef"[c&0xF])
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// typeName is the query type's mnemonic, or TYPEn (RFC 3597).
func typeName(t uint16) string {
	if s, ok := dns.TypeToString[t]; ok {
		return s
	}
	return "TYPE" + strconv.Itoa(int(t))
}

// rcodeMnemonic is the rcode's mnemonic; 16 in an answer is BADVERS (BADSIG is
// a TSIG error, never an rcode the proxy sends).
func rcodeMnemonic(rcode int) string {
	if rcode == dns.RcodeBadVers {
		return "BADVERS"
	}
	if s, ok := dns.RcodeToString[rcode]; ok {
		return s
	}
	return "RCODE" + strconv.Itoa(rcode)
}
