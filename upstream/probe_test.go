package upstream

import (
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/internal/wire"
)

// A probe waits a few of the quickest exact replies, from a floor to the
// timeout; without one, a few of the quickest replies in another case, from
// a tenth of the timeout (a forged one cannot shorten it) to the timeout;
// without either, a tenth of the timeout.
func TestProbeWait(t *testing.T) {
	const ms = time.Millisecond
	for _, tt := range []struct {
		name          string
		exact         time.Duration
		exactOK       bool
		folded        time.Duration
		foldedOK      bool
		timeout, want time.Duration
	}{
		{"no reply yet: a tenth of the timeout", 0, false, 0, false, 2000 * ms, 200 * ms},
		{"loopback: the floor", 50 * time.Microsecond, true, 0, false, 2000 * ms, ms},
		{"a LAN resolver: four round trips", 2 * ms, true, 0, false, 2000 * ms, 8 * ms},
		{"a far resolver: four round trips, past a tenth of the timeout", 80 * ms, true, 0, false, 2000 * ms, 320 * ms},
		{"a resolver farther than a quarter of the timeout: the timeout", 800 * ms, true, 0, false, 2000 * ms, 2000 * ms},
		{"a short timeout: the floor", 50 * time.Microsecond, true, 0, false, 5 * ms, ms},
		{"a timeout below the floor: the timeout", 50 * time.Microsecond, true, 0, false, 500 * time.Microsecond, 500 * time.Microsecond},
		{"exact known: a quicker reply in another case, maybe forged, changes nothing", 40 * ms, true, 100 * time.Microsecond, true, 1000 * ms, 160 * ms},
		{"no exact reply, a far one that does not echo: four of its round trips", 0, false, 250 * ms, true, 2000 * ms, 1000 * ms},
		{"no exact reply, a near one that does not echo: a tenth of the timeout", 0, false, 2 * ms, true, 2000 * ms, 200 * ms},
		{"no exact reply, a forged quick one: still a tenth of the timeout", 0, false, 10 * time.Microsecond, true, 1000 * ms, 100 * ms},
		{"no exact reply, one past a quarter of the timeout: the timeout", 0, false, 900 * ms, true, 2000 * ms, 2000 * ms},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := probeWait(tt.exact, tt.exactOK, tt.folded, tt.foldedOK, tt.timeout); got != tt.want {
				t.Fatalf("probeWait(%v, %v, %v, %v, %v) = %v, want %v", tt.exact, tt.exactOK, tt.folded, tt.foldedOK, tt.timeout, got, tt.want)
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
