package cache

import (
	"bytes"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// TestEntryHoldsItsKey checks the key an entry keeps in two parts, its
// first inlineKey bytes in its struct and the rest at the head of its
// data: every key length around the split is stored, found, and told
// apart from a key that differs in either part, and the records after a
// long key's tail are the reply's.
func TestEntryHoldsItsKey(t *testing.T) {
	const zone = ".example.com." // 13 bytes on the wire past the first label
	for _, label := range []int{1, 20, 21, 22, 23, 60, 63} {
		// A key is the name (label, its length byte, the zone's 13), the
		// type and class, and one byte of bits: label + 19 bytes.
		name := strings.Repeat("a", label) + zone
		t.Run(name, func(t *testing.T) {
			q := query(name, dns.TypeA, wire.KeyRD)
			reply := pack(t, answer(t, q, dns.RcodeSuccess, []string{name + " 300 IN A 192.0.2.1"}, nil, nil))
			k := keyOf(t, q)
			c := newCache(t, Config{})
			if err := c.Store(k, reply, t0); err != nil {
				t.Fatal(err)
			}
			h, st := c.Lookup(k, t0)
			if st != Fresh {
				t.Fatalf("a key of %d bytes: %v, want fresh", len(k.Bytes()), st)
			}
			qend, _ := wire.QuestionEnd(reply)
			sec, _ := wire.ReadSections(reply, qend)
			if !bytes.Equal(h.Records(), reply[qend:sec.End]) {
				t.Fatalf("a key of %d bytes: records %x, want the reply's %x", len(k.Bytes()), h.Records(), reply[qend:sec.End])
			}
			e := h.e
			key := k.Bytes()
			if !e.holds(key) || !e.sameKey(e) {
				t.Fatalf("a key of %d bytes is not its own entry's", len(key))
			}
			for _, at := range []int{0, min(inlineKey, len(key)) - 1, len(key) - 1, inlineKey, len(key) - 2} {
				if at < 0 || at >= len(key) {
					continue
				}
				other := bytes.Clone(key)
				other[at] ^= 0x20
				if e.holds(other) {
					t.Errorf("a key of %d bytes differing at byte %d is held", len(key), at)
				}
			}
			if e.holds(key[:len(key)-1]) || e.holds(append(bytes.Clone(key), 0)) {
				t.Error("a shorter or a longer key is held")
			}
		})
	}
}

// TestEntryTellsKeysApartAtEveryByte checks holds for every key length
// from the shortest a query has (the root's, 6 bytes) to past inlineKey:
// a key is held by its own entry, and not when it differs at any one byte
// or is a byte shorter or longer. A lookup's key lies in a longer array
// than its length, so the bytes past it (what an earlier, longer key left
// there) must not count either.
func TestEntryTellsKeysApartAtEveryByte(t *testing.T) {
	for n := 6; n <= inlineKey+8; n++ {
		stored := make([]byte, n)
		for i := range stored {
			stored[i] = byte(i*7 + n)
		}
		e := &entry{keyLen: uint16(n), data: bytes.Clone(stored[min(n, inlineKey):])}
		copy(e.key[:], stored)
		backing := bytes.Repeat([]byte{0xAA}, wire.MaxQuestionLen+1) // a longer key's leftovers
		key := append(backing[:0], stored...)
		if !e.holds(key) {
			t.Fatalf("a key of %d bytes is not held by its own entry", n)
		}
		for at := range n {
			key[at] ^= 1
			if e.holds(key) {
				t.Errorf("a key of %d bytes differing at byte %d is held", n, at)
			}
			key[at] ^= 1
		}
		if e.holds(key[:n-1]) || e.holds(backing[:n+1]) {
			t.Errorf("a key of %d bytes: a byte shorter or longer is held", n)
		}
	}
}
