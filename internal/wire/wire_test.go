package wire

import (
	"testing"

	"github.com/miekg/dns"
)

func pack(t *testing.T, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestQuestionEndAndType(t *testing.T) {
	m := new(dns.Msg)
	m.SetQuestion("www.Example.com.", dns.TypeAAAA)
	b := pack(t, m)
	end, ok := QuestionEnd(b)
	if !ok || end != len(b) {
		t.Fatalf("QuestionEnd = %d, %v; want %d", end, ok, len(b))
	}
	if QType(b, end) != dns.TypeAAAA {
		t.Fatalf("QType = %d", QType(b, end))
	}
	root := pack(t, new(dns.Msg).SetQuestion(".", dns.TypeNS))
	if end, ok := QuestionEnd(root); !ok || end != 12+1+4 {
		t.Fatalf("root: %d %v", end, ok)
	}
	bad := map[string][]byte{
		"short":       b[:14],
		"no type":     b[:len(b)-2],
		"pointer":     append(append([]byte{}, b[:12]...), 0xC0, 12, 0, 1, 0, 1),
		"label 64":    append(append(append([]byte{}, b[:12]...), 64), make([]byte, 70)...),
		"header only": b[:12],
	}
	long := append([]byte{}, b[:12]...)
	for range 5 {
		long = append(long, 63)
		long = append(long, make([]byte, 63)...)
	}
	bad["name over 255"] = append(long, 0, 0, 1, 0, 1)
	for name, pkt := range bad {
		if _, ok := QuestionEnd(pkt); ok {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestEqualQuestion(t *testing.T) {
	a := pack(t, new(dns.Msg).SetQuestion("www.example.com.", dns.TypeA))
	b := pack(t, new(dns.Msg).SetQuestion("WWW.example.COM.", dns.TypeA))
	c := pack(t, new(dns.Msg).SetQuestion("www.example.com.", dns.TypeAAAA))
	d := pack(t, new(dns.Msg).SetQuestion("www.example.org.", dns.TypeA))
	if !EqualQuestion(a[12:], b[12:]) {
		t.Error("case should not matter")
	}
	if EqualQuestion(a[12:], c[12:]) || EqualQuestion(a[12:], d[12:]) || EqualQuestion(a[12:], a[12:len(a)-1]) {
		t.Error("different questions compared equal")
	}
}

func TestEDNSSize(t *testing.T) {
	m := new(dns.Msg).SetQuestion("example.com.", dns.TypeA)
	m.SetEdns0(1232, true)
	b := pack(t, m)
	end, _ := QuestionEnd(b)
	if size, ok := EDNSSize(b, end); !ok || size != 1232 {
		t.Fatalf("EDNSSize = %d, %v", size, ok)
	}
	if _, ok := EDNSSize(b[:len(b)-1], end); ok {
		t.Error("a cut OPT record was accepted")
	}
	if _, ok := EDNSSize(append(b, 0), end); ok {
		t.Error("trailing bytes after OPT were accepted")
	}
}

func TestAppendReply(t *testing.T) {
	q := new(dns.Msg).SetQuestion("example.com.", dns.TypeMX)
	q.Id, q.RecursionDesired, q.Opcode = 777, true, dns.OpcodeQuery
	b := pack(t, q)
	end, _ := QuestionEnd(b)
	r := new(dns.Msg)
	if err := r.Unpack(AppendReply(nil, b, end, dns.RcodeServerFailure)); err != nil {
		t.Fatal(err)
	}
	if r.Id != 777 || !r.Response || !r.RecursionDesired || !r.RecursionAvailable || r.Rcode != dns.RcodeServerFailure ||
		len(r.Question) != 1 || r.Question[0] != q.Question[0] {
		t.Fatalf("reply %v", r)
	}
	hdr := AppendReply(nil, b[:12], 12, dns.RcodeFormatError)
	if err := r.Unpack(hdr); err != nil || len(r.Question) != 0 || r.Rcode != dns.RcodeFormatError {
		t.Fatalf("header-only reply: %v %v", r, err)
	}
}

// EqualQuestion folds case on the name's letters only: type HTTPS (65, 'A'
// as a byte) is not type 97 ('a'), nor class 65 class 97.
func TestEqualQuestionFoldsOnlyTheName(t *testing.T) {
	q := func(name string, qtype, qclass uint16) []byte {
		m := new(dns.Msg).SetQuestion(name, qtype)
		m.Question[0].Qclass = qclass
		return pack(t, m)[HeaderLen:]
	}
	tests := []struct {
		name string
		a, b []byte
		want bool
	}{
		{"name case", q("WwW.Example.COM.", 65, 1), q("www.example.com.", 65, 1), true},
		{"type 65 vs 97", q("www.example.com.", 65, 1), q("www.example.com.", 97, 1), false},
		{"class 65 vs 97", q("www.example.com.", 1, 65), q("www.example.com.", 1, 97), false},
		{"type 90 vs 122", q("a.", 90, 1), q("a.", 122, 1), false},
		{"different name", q("a.example.", 1, 1), q("b.example.", 1, 1), false},
		{"too short", []byte{0, 0}, []byte{0, 0}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := EqualQuestion(tt.a, tt.b); got != tt.want {
				t.Fatalf("EqualQuestion = %v, want %v", got, tt.want)
			}
		})
	}
}
