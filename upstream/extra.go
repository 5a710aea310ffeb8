package upstream

// The sends the upstream makes on its own. Forward is asked for one send,
// and the caller has paid for it (the pool's outbound token). The upstream
// puts a query on the wire again in four cases: a TCP connection failed
// under it (tcpConn.fail), its UDP reply was too large to read and is
// fetched over TCP, its reply came in another case just as 0x20 was
// switched off and it goes again in the caller's case, and the probes of
// a 0x20 series (case.go). Each is paid: Config.AllowExtra is asked right
// before it, and a refusal means the query is not sent; it ends with
// ErrLimited, a query never sent (NotSent), and a probe series ends. So the
// outbound limit bounds everything the upstream sees, not only the attempts.

// extraSend readies c to go out once more, beyond the send Forward was
// asked for: it pays Config.AllowExtra for it. It returns ErrLimited if
// AllowExtra refuses; then c is not to be sent, and the caller, who took c
// out of its table, reports it with that error.
func (u *Upstream) extraSend(c *call) error {
	if !u.allowExtra() {
		return ErrLimited
	}
	return nil
}

// allowExtra pays Config.AllowExtra for one send the upstream makes on its own.
func (u *Upstream) allowExtra() bool { return u.cfg.AllowExtra == nil || u.cfg.AllowExtra() }
