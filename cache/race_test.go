package cache

import (
	"sync"
	"testing"
	"time"

	"dnsproxi/internal/wire"
)

// TestConcurrentUse runs every call at once on the real clock, for -race:
// readers' hits must see whole entries (and Servable its marks) while
// writers replace, evict, mark failures and flush, and the bookkeeping must add up after.
func TestConcurrentUse(t *testing.T) {
	c := newCache(t, Config{Size: MinSize, StaleWindow: time.Hour, Prefetch: true})
	msgs, keys := replies(t, 400, 9)
	deadline := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			buf := make([]byte, 0, 4096)
			for i := 0; i < 20000 && time.Now().Before(deadline); i++ {
				j := (i*7 + w*13) % len(keys)
				now := time.Now()
				switch {
				case w == 0 && i%500 == 0:
					c.Flush()
				case w < 3:
					if err := c.Store(keys[j], msgs[j], now); err != nil {
						t.Error(err)
						return
					}
				case i%50 == 0:
					c.RefreshFailed(keys[j], now)
				default:
					h, st := c.Lookup(keys[j], now)
					if st == Miss {
						continue
					}
					c.Servable(h, now) // the flush count and the prefetch mark, read while a flush writes them
					// The answer built from it walks, with the counts it gives.
					qend, _ := wire.QuestionEnd(msgs[j])
					an, ns, ar := h.Counts()
					buf = append(buf[:0], msgs[j][:qend]...)
					wire.SetCounts(buf, 1, an, ns, ar)
					buf = h.AppendRecords(buf)
					sec, ok := wire.ReadSections(buf, qend)
					if !ok || sec.End != len(buf) || sec.AN != an || an == 0 || len(buf)-qend != h.Len() {
						t.Errorf("a hit of %d records does not walk: %+v", an, sec)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	checkInvariants(t, c)
}
