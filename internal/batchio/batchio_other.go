//go:build !linux

package batchio

type readerSys struct{}

func (readerSys) init(*Reader) error { return nil }

// read reads one datagram: without recvmmsg, a batch of one.
func (readerSys) read(r *Reader) (int, error) {
	n, from, err := r.conn.ReadFromUDPAddrPort(r.bufs[0])
	if err != nil {
		return 0, err
	}
	r.sizes[0], r.addrs[0] = n, from
	r.cut[0] = n == len(r.bufs[0]) // without recvmmsg's flags: a full buffer may have been cut
	return 1, nil
}

func (s readerSys) serve(r *Reader, handle func(n int)) error {
	for {
		n, err := s.read(r)
		if err != nil {
			return err
		}
		handle(n)
	}
}

type writerSys struct{}

// sendsInline: a plain write may wait, so a Release leaves it to run.
const sendsInline = false

func (writerSys) init(*Writer) error { return nil }

func (writerSys) write(w *Writer, ps []packet, arena []byte, _ bool) (int, bool) {
	p := ps[0]
	if p.to.IsValid() {
		w.conn.WriteToUDPAddrPort(arena[p.start:p.end], p.to)
	} else {
		w.conn.Write(arena[p.start:p.end])
	}
	return 1, true
}
