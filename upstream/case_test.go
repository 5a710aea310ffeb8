package upstream

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// A reply whose question differs from what was sent only in letter case
// does not answer the query while 0x20 is on; the caller gets the reply that
// does, with its own case restored in both the query and the reply.
func TestCaseChangedReplyIsNotAnAnswer(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, tcp bool) []*dns.Msg {
		if tcp {
			return []*dns.Msg{answer(req)}
		}
		changed := answer(req)
		changed.Question[0].Name = flipCase(req.Question[0].Name)
		rr, _ := dns.NewRR(req.Question[0].Name + " 60 IN A 203.0.113.66")
		changed.Answer = []dns.RR{rr}
		return []*dns.Msg{changed, answer(req)}
	})
	for _, name := range []string{"www.example.com.", "WwW.ExAmPlE.CoM.", "MAIL.EXAMPLE.ORG."} {
		t.Run(name, func(t *testing.T) {
			// An upstream of its own: every send, probes included, is answered
			// first in another case, then exactly; the exact replies overrule
			// the others and 0x20 stays on (TestExactReplyOverrulesForgedCaseChange).
			u := newUpstream(t, Config{Addr: srv.addr()})
			query := q(name)
			b, _ := query.Pack()
			sent := slices.Clone(b)
			type outcome struct {
				query, reply []byte
				err          error
			}
			ch := make(chan outcome, 1)
			u.Forward(b, "udp", func(query, reply []byte, err error) {
				ch <- outcome{slices.Clone(query), slices.Clone(reply), err}
			})
			var o outcome
			select {
			case o = <-ch:
			case <-time.After(5 * time.Second):
				t.Fatal("no report")
			}
			if o.err != nil {
				t.Fatal(o.err)
			}
			if string(o.query) != string(sent) {
				t.Errorf("done got the query %x, want it as the caller sent it: %x", o.query, sent)
			}
			m := new(dns.Msg)
			if err := m.Unpack(o.reply); err != nil {
				t.Fatal(err)
			}
			if got := m.Answer[0].(*dns.A).A; !got.Equal(net.IPv4(192, 0, 2, 1)) {
				t.Errorf("accepted the reply with the case changed (answer %v)", got)
			}
			if m.Question[0].Name != name {
				t.Errorf("reply's question %q, want the caller's %q", m.Question[0].Name, name)
			}
			if owner := m.Answer[0].Header().Name; owner != name {
				t.Errorf("answer's owner %q, want the caller's %q", owner, name)
			}
		})
	}
}

// flipCase swaps the case of every ASCII letter.
func flipCase(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case 'a' <= r && r <= 'z':
			return r - 'a' + 'A'
		case 'A' <= r && r <= 'Z':
			return r - 'A' + 'a'
		}
		return r
	}, s)
}

// Forged replies with the right ID and the case changed, one on each of
// many queries, switch nothing off: the real upstream echoes the case, and
// the queries that follow still go out with their letters mixed.
func TestForgedCaseChangesKeep0x20(t *testing.T) {
	var mu sync.Mutex
	forgedFor := map[string]bool{}
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg {
		name := strings.ToLower(req.Question[0].Name)
		mu.Lock()
		defer mu.Unlock()
		if !strings.HasPrefix(name, "forge") || forgedFor[name] {
			return []*dns.Msg{answer(req)}
		}
		forgedFor[name] = true // one forgery per query: a spoofer who guessed the ID once
		forged := answer(req)
		forged.Question[0].Name = flipCase(req.Question[0].Name)
		rr, _ := dns.NewRR(req.Question[0].Name + " 60 IN A 203.0.113.66")
		forged.Answer = []dns.RR{rr}
		return []*dns.Msg{forged, answer(req)}
	})
	u := newUpstream(t, Config{Addr: srv.addr()})
	for i := range 20 {
		r, err := u.Exchange(context.Background(), q(fmt.Sprintf("forged%d.example.", i)), "udp")
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Answer[0].(*dns.A).A; !got.Equal(net.IPv4(192, 0, 2, 1)) {
			t.Fatalf("query %d took the forged answer %v", i, got)
		}
	}
	const name = "after-the-forgeries.example." // 23 letters
	srv.mu.Lock()
	before := len(srv.names)
	srv.mu.Unlock()
	for range 10 {
		if _, err := u.Exchange(context.Background(), q(name), "udp"); err != nil {
			t.Fatal(err)
		}
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for _, sent := range srv.names[before:] {
		if sent == name {
			t.Fatalf("after 20 forged case changes, %q went out in the caller's case: 0x20 was switched off", sent)
		}
	}
	if st := u.Stats(); st.PlainCase || st.CaseMismatches < 20 {
		t.Fatalf("%+v, want 20 mismatches or more and 0x20 still on", st)
	}
}

// An upstream that answers with the name in a case of its own costs the
// first query a few round trips (its probes), not the query: 0x20 is
// switched off for it, once, and the query sent again in the caller's case.
func TestCaseFallback(t *testing.T) {
	srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg {
		m := answer(req)
		m.Question[0].Name = strings.ToLower(req.Question[0].Name)
		return []*dns.Msg{m}
	})
	fellBack := make(chan struct{}, 2)
	u := newUpstream(t, Config{Addr: srv.addr(), OnCaseFallback: func() { fellBack <- struct{}{} }})
	const name = "Mixed.Example.COM."
	r, err := u.Exchange(context.Background(), q(name), "udp")
	if err != nil {
		t.Fatal(err)
	}
	if r.Question[0].Name != name || !r.Answer[0].(*dns.A).A.Equal(net.IPv4(192, 0, 2, 1)) {
		t.Fatalf("got %v %v, want the answer with the caller's case", r.Question, r.Answer)
	}
	select {
	case <-fellBack:
	case <-time.After(5 * time.Second):
		t.Fatal("OnCaseFallback not called")
	}
	st := u.Stats()
	if !st.PlainCase || st.CaseProbes != caseProbes || st.CaseResends != 1 {
		t.Fatalf("%+v, want PlainCase after %d probes and 1 query sent again", st, caseProbes)
	}
	srv.mu.Lock()
	first := slices.Clone(srv.names)
	srv.mu.Unlock()
	if len(first) != caseProbes+2 || first[len(first)-1] != name {
		t.Fatalf("the upstream saw %q, want the query, %d probes, then the query in the caller's case", first, caseProbes)
	}
	for range 10 {
		if _, err := u.Exchange(context.Background(), q(name), "udp"); err != nil {
			t.Fatal(err)
		}
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for _, sent := range srv.names[len(first):] {
		if sent != name {
			t.Fatalf("after the fallback %q went out, want the caller's %q", sent, name)
		}
	}
	if len(srv.names) != len(first)+10 {
		t.Fatalf("10 queries after the fallback took %d sends", len(srv.names)-len(first))
	}
	if len(fellBack) != 0 || u.Stats().CaseProbes != caseProbes {
		t.Fatalf("the fallback was reported again or probes went on: %+v", u.Stats())
	}
}

// The evidence rule: only caseProbes probes in a row answered in another
// case, with no exact reply in time, switch 0x20 off. Here the upstream
// answers the query in another case only, and the first k probes too (as
// an upstream that does not echo case), then echoes case again: below
// caseProbes, the next probe's exact reply ends the series with 0x20 on;
// from caseProbes on, 0x20 is off after caseProbes probes and the query,
// sent again in the caller's case, is answered before its deadline.
func TestCaseFallbackNeedsProbesInARow(t *testing.T) {
	const victim = "victim.example."
	for k := 0; k <= caseProbes+1; k++ {
		wantPlain := k >= caseProbes
		wantProbes := uint64(min(k+1, caseProbes))
		t.Run(fmt.Sprintf("%d probes case-changed", k), func(t *testing.T) {
			var mu sync.Mutex
			probes := 0
			srv := newTestServer(t, func(req *dns.Msg, _ bool) []*dns.Msg {
				changed := answer(req)
				changed.Question[0].Name = flipCase(req.Question[0].Name)
				if strings.EqualFold(req.Question[0].Name, victim) {
					return []*dns.Msg{changed}
				}
				mu.Lock()
				defer mu.Unlock()
				if probes++; probes <= k {
					return []*dns.Msg{changed}
				}
				return []*dns.Msg{answer(req)}
			})
			// No exact reply before the probes: each waits Timeout/10, 200 ms,
			// and the fallback comes after 0.3 to 0.45 of the timeout, leaving
			// the rest, 1.1 s at least, to a loaded machine.
			u := newUpstream(t, Config{Addr: srv.addr(), Timeout: 2 * time.Second})
			type outcome struct {
				reply []byte
				err   error
			}
			done := make(chan outcome, 1)
			b, _ := q(victim).Pack()
			u.Forward(b, "udp", func(_, reply []byte, err error) { done <- outcome{slices.Clone(reply), err} })
			if wantPlain {
				select {
				case o := <-done:
					m := new(dns.Msg)
					if o.err != nil || m.Unpack(o.reply) != nil || m.Question[0].Name != victim {
						t.Fatalf("the query sent again after the fallback: %v, want its answer", o.err)
					}
				case <-time.After(5 * time.Second):
					t.Fatal("the query was not answered within 5s")
				}
			}
			deadline := time.Now().Add(5 * time.Second)
			for u.Stats().CaseProbes < wantProbes || (u.cases.probing.Load() && !u.cases.plain.Load()) {
				if time.Now().After(deadline) {
					t.Fatalf("the probes did not settle within 5s: %+v", u.Stats())
				}
				time.Sleep(time.Millisecond)
			}
			if st := u.Stats(); st.PlainCase != wantPlain || st.CaseProbes != wantProbes {
				t.Fatalf("%d probes answered in another case: %+v, want PlainCase %v after %d probes", k, st, wantPlain, wantProbes)
			}
		})
	}
}

func TestEqualFoldOnlyOnNameLetters(t *testing.T) {
	question := func(name string, qtype, qclass uint16) []byte {
		m := new(dns.Msg)
		m.Question = []dns.Question{{Name: name, Qtype: qtype, Qclass: qclass}}
		b, _ := m.Pack()
		return b[12:]
	}
	for _, tt := range []struct {
		name string
		a, b []byte
		want bool
	}{
		{"same", question("a.example.", dns.TypeA, dns.ClassINET), question("a.example.", dns.TypeA, dns.ClassINET), true},
		{"name case", question("a.example.", dns.TypeA, dns.ClassINET), question("A.ExAmple.", dns.TypeA, dns.ClassINET), true},
		{"type differs by 0x20", question("a.example.", 0x41, dns.ClassINET), question("a.example.", 0x61, dns.ClassINET), false},
		{"class differs by 0x20", question("a.example.", dns.TypeA, 0x0043), question("a.example.", dns.TypeA, 0x0063), false},
		{"not letters differing by 0x20", question("a@.example.", dns.TypeA, dns.ClassINET), question("a`.example.", dns.TypeA, dns.ClassINET), false},
		{"other name", question("a.example.", dns.TypeA, dns.ClassINET), question("b.example.", dns.TypeA, dns.ClassINET), false},
		{"other length", question("a.example.", dns.TypeA, dns.ClassINET), question("aa.example.", dns.TypeA, dns.ClassINET), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := equalFold(tt.a, tt.b); got != tt.want {
				t.Errorf("equalFold(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
			}
		})
	}
}
