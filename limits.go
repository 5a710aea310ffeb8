package main

import (
	"errors"
	"strconv"
	"strings"

	"github.com/miekg/dns"

	"dnsproxi/dnsserver"
	"dnsproxi/internal/wire"
)

// ActionKind is what a UDP query refused by an entry gate gets.
type ActionKind int

// The actions of DNS_LIMIT_ACTION.
const (
	ActionDrop   ActionKind = iota // no answer: the client waits out its timeout
	ActionRefuse                   // REFUSED at once
	ActionSlip                     // every Nth an empty answer with TC, the rest dropped
)

// maxSlip is the largest N of slip:N: beyond it a real client would retry
// over UDP so many times before it is told to use TCP that it gives up.
const maxSlip = 10

// LimitAction is DNS_LIMIT_ACTION: drop, refuse, slip or slip:N. The zero
// value is drop. N is 2 for a bare slip, and only means something for slip.
type LimitAction struct {
	Kind ActionKind
	N    int
}

var errAction = errors.New("must be drop, refuse, slip or slip:N with N from 1 to " + strconv.Itoa(maxSlip))

// Decode parses drop, refuse, slip or slip:N (any case, spaces allowed
// around N).
func (a *LimitAction) Decode(s string) error {
	word, nText, hasN := strings.Cut(strings.ToLower(strings.TrimSpace(s)), ":")
	switch {
	case word == "drop" && !hasN:
		*a = LimitAction{Kind: ActionDrop}
	case word == "refuse" && !hasN:
		*a = LimitAction{Kind: ActionRefuse}
	case word == "slip" && !hasN:
		*a = LimitAction{Kind: ActionSlip, N: 2}
	case word == "slip":
		n, err := strconv.Atoi(strings.TrimSpace(nText))
		if err != nil || n < 1 || n > maxSlip {
			return errAction
		}
		*a = LimitAction{Kind: ActionSlip, N: n}
	default:
		return errAction
	}
	return nil
}

// String formats the action as it is written in DNS_LIMIT_ACTION.
func (a LimitAction) String() string {
	switch a.Kind {
	case ActionRefuse:
		return "refuse"
	case ActionSlip:
		return "slip:" + strconv.Itoa(a.N)
	}
	return "drop"
}

// limited answers q, refused by an entry gate whose error is e. Over TCP,
// where the source is proven and a dropped query holds a connection for the
// client's whole timeout, it is REFUSED with e. Over UDP, as the action
// says, and never larger than the query: no bucket bounds these answers,
// so a flood forging a victim's source must get nothing to amplify. Refuse
// answers every refused query REFUSED, without the Extended DNS Error (with
// it, 16–23 bytes larger than a query for ".": a flood reflected 1.57–1.82×,
// TestAttackRefuseActionAmplifiesASpoofedFlood). Slip answers every Nth
// refused query (counted across clients, so a flood gets at most 1/N of its
// refused queries answered) with an empty TC answer: the query's question
// and an OPT if it had one, which a real client retries over TCP (where it
// gets REFUSED with the EDE). It returns the rcode answered, or noAnswer.
func (p *proxy) limited(w dnsserver.ResponseWriter, q *dnsserver.Query, e *ede) (rcode int) {
	switch {
	case q.Net == "tcp":
		p.own(w, q, dns.RcodeRefused, e)
		return dns.RcodeRefused
	case p.action.Kind == ActionRefuse:
		p.own(w, q, dns.RcodeRefused, nil)
		return dns.RcodeRefused
	case p.action.Kind == ActionSlip && p.slips.Add(1)%uint64(max(p.action.N, 1)) == 0:
		bp := getBuf()
		b := p.appendOwn((*bp)[:0], wire.ID(q.Wire), wire.Flags(q.Wire), q.Wire[wire.HeaderLen:q.QEnd], q.EDNS.Present, q.EDNS.DO, dns.RcodeSuccess, nil)
		wire.SetFlags(b, wire.Flags(b)|wire.FlagTC)
		w.Write(b)
		putBuf(bp, b)
		return dns.RcodeSuccess
	default:
		w.Drop()
		return noAnswer
	}
}
