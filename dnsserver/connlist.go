package dnsserver

// connList is the server's open TCP connections in the order of their last
// whole query, the oldest first; a connection with none yet counts from its
// opening. It is what a new connection looks through when every slot is
// taken (takeConnSlot). It is linked through the connections themselves, so
// that a query moves its connection to the back without allocating. It is
// guarded by Server.mu.
type connList struct {
	front, back *clientConn
}

// pushBack adds cc, which is in no list, as the newest.
func (l *connList) pushBack(cc *clientConn) {
	cc.prev, cc.next = l.back, nil
	if l.back != nil {
		l.back.next = cc
	} else {
		l.front = cc
	}
	l.back = cc
}

// remove takes cc, which is in l, out of it.
func (l *connList) remove(cc *clientConn) {
	if cc.prev != nil {
		cc.prev.next = cc.next
	} else {
		l.front = cc.next
	}
	if cc.next != nil {
		cc.next.prev = cc.prev
	} else {
		l.back = cc.prev
	}
	cc.prev, cc.next = nil, nil
}

// moveToBack makes cc, which is in l, the newest.
func (l *connList) moveToBack(cc *clientConn) {
	if l.back == cc {
		return
	}
	l.remove(cc)
	l.pushBack(cc)
}
