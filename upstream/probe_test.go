package upstream

import (
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// A probe waits a few of the quickest replies, within a floor and the
// timeout; a tenth of the timeout while no reply was ever seen.
func TestProbeWait(t *testing.T) {
	for _, tt := range []struct {
		name    string
		quick   time.Duration
		known   bool
		timeout time.Duration
		want    time.Duration
	}{
		{"no reply yet: a tenth of the timeout", 0, false, 2 * time.Second, 200 * time.Millisecond},
		{"loopback: the floor", 50 * time.Microsecond, true, 2 * time.Second, time.Millisecond},
		{"a LAN resolver: four round trips", 2 * time.Millisecond, true, 2 * time.Second, 8 * time.Millisecond},
		{"a far resolver: four round trips, past a tenth of the timeout", 80 * time.Millisecond, true, 2 * time.Second, 320 * time.Millisecond},
		{"a resolver farther than a quarter of the timeout: the timeout", 800 * time.Millisecond, true, 2 * time.Second, 2 * time.Second},
		{"a short timeout: the floor", 50 * time.Microsecond, true, 5 * time.Millisecond, time.Millisecond},
		{"a timeout below the floor: the timeout", 50 * time.Microsecond, true, 500 * time.Microsecond, 500 * time.Microsecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := probeWait(tt.quick, tt.known, tt.timeout); got != tt.want {
				t.Fatalf("probeWait(%v, %v, %v) = %v, want %v", tt.quick, tt.known, tt.timeout, got, tt.want)
			}
		})
	}
}

// quickest keeps the quickest reply of the current and the last period that
// had one: a slower reply never raises it, and an old quick one ages out two
// periods later.
func TestQuickest(t *testing.T) {
	var q quickest
	ms := time.Millisecond
	for i, step := range []struct {
		add       time.Duration // 0: none
		roll      bool
		want      time.Duration
		wantKnown bool
	}{
		{0, false, 0, false},
		{3 * ms, false, 3 * ms, true},
		{5 * ms, false, 3 * ms, true}, // slower: no change
		{2 * ms, false, 2 * ms, true},
		{0, true, 2 * ms, true},       // new period: the last one's still counts
		{4 * ms, false, 2 * ms, true}, // this period's 4 ms, the last one's 2 ms
		{0, true, 4 * ms, true},       // 2 ms aged out
		{0, true, 4 * ms, true},       // a period with no reply keeps the last that had one
		{0, false, 4 * ms, true},
		{1, false, 1, true}, // 1 ns: 0 would mean none
	} {
		if step.add != 0 {
			q.add(step.add)
		}
		if step.roll {
			q.roll()
		}
		if got, known := q.get(); got != step.want || known != step.wantKnown {
			t.Fatalf("step %d: get() = %v, %v; want %v, %v", i, got, known, step.want, step.wantKnown)
		}
	}
}

// A probe's name always has letters in both cases, so that an upstream that
// folds every name one way never sends it back unchanged.
func TestBothCases(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"\x09localhost\x00", "\x09Localhost\x00"},
		{"\x09LOCALHOST\x00", "\x09lOCALHOST\x00"},
		{"\x09LoCaLhOsT\x00", "\x09LoCaLhOsT\x00"},
		{"\x011\x03com\x00", "\x011\x03Com\x00"},
		{"\x0212\x00", "\x0212\x00"}, // no letter: nothing to do
	} {
		name := []byte(tt.in)
		bothCases(name)
		if string(name) != tt.want {
			t.Errorf("bothCases(%q) = %q, want %q", tt.in, name, tt.want)
		}
	}
}

// A probe asks the question a socket last had answered exactly, if it has
// two letters or more, else localhost; always one question, recursion
// desired.
func TestProbeQuery(t *testing.T) {
	wireName := func(name string) []byte {
		m := new(dns.Msg)
		m.SetQuestion(name, dns.TypeMX)
		b, _ := m.Pack()
		return b[wire.HeaderLen:]
	}
	for _, tt := range []struct {
		name  string
		known []byte
		want  []byte
	}{
		{"nothing answered exactly", nil, localhostQuestion},
		{"a known question", wireName("mail.example."), wireName("mail.example.")},
		{"a known question of one letter", wireName("1.2.x."), localhostQuestion},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := &udpSocket{known: tt.known}
			sl := &udpSlot{}
			sl.cur.Store(s)
			u := &Upstream{socks: []*udpSlot{sl}}
			s.u = u
			got := u.probeQuery()
			if qd, an, ns, ar := wire.Counts(got); qd != 1 || an+ns+ar != 0 || wire.Flags(got)&wire.FlagRD == 0 {
				t.Fatalf("probe %x: want one question, recursion desired", got)
			}
			if q := got[wire.HeaderLen:]; string(q) != string(tt.want) {
				t.Fatalf("probe asks %q, want %q", q, tt.want)
			}
			m := new(dns.Msg)
			if err := m.Unpack(got); err != nil || !strings.HasSuffix(m.Question[0].Name, ".") {
				t.Fatalf("probe does not parse: %v", err)
			}
		})
	}
}
