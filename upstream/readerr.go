package upstream

import (
	"errors"
	"syscall"
	"time"
)

// What a UDP socket's reader does after a read error.
//
// On a connected UDP socket the kernel turns an ICMP error about a packet
// the socket sent (port, host or network unreachable...) into an error the
// next read or write reports, once, and clears. Such an error says nothing
// about the socket: the read that reported it consumed it, and the replies
// queued behind it are still to be read, so the reader reads on at once.
// Pausing instead costs every query on the socket the pause, once per
// error: 1 ms a piece (as the reader once did), anyone able to get more
// than 1,000 ICMP errors a second to the socket — an upstream that refuses
// some packets, or a sender that knows the port and forges them — kept
// every reply on it unread for as long as they came
// (TestAttackICMPErrorsDoNotHoldUpReplies). Each costs one read, as a
// stray packet would.
//
// Any other error may be one that stays (the socket is broken): the first
// is read past at once, and each repeat with no reply read in between
// waits twice as long as the one before, from minReadPause up to
// maxReadPause, so that a persistent error costs some ten reads a second,
// never a core. A reply read ends the streak.
const (
	minReadPause = time.Millisecond
	maxReadPause = 100 * time.Millisecond
)

// isICMPError reports whether err is one the kernel made of an ICMP error.
func isICMPError(err error) bool {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return false
	}
	for _, e := range icmpErrors {
		if errno == e {
			return true
		}
	}
	return false
}

// readErrors is a reader's streak of errors that may persist. The zero
// value has none.
type readErrors struct {
	streak int // errors in a row, ICMP errors aside, with no reply read between
}

// pause returns how long to wait before reading again after err ended a
// read; read reports whether that read took any packet first.
func (r *readErrors) pause(err error, read bool) time.Duration {
	if read {
		r.streak = 0
	}
	if isICMPError(err) {
		return 0
	}
	r.streak++
	if r.streak == 1 {
		return 0
	}
	d := minReadPause
	for i := 2; i < r.streak && d < maxReadPause; i++ {
		d *= 2
	}
	return min(d, maxReadPause)
}
