package batchio

import (
	"slices"
	"sync"
	"sync/atomic"
)

// Group is a set of Writers held and released together. A goroutine that
// is about to hand out a batch of replies, each of which may be answered
// through any Writer of the group, holds the group for the batch: the
// answers then leave in one system call a socket, not one each. A nil
// *Group holds nothing.
type Group struct {
	mu      sync.Mutex // serializes Add and Remove
	writers atomic.Pointer[[]*Writer]
}

// Add puts w in the group.
func (g *Group) Add(w *Writer) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var ws []*Writer
	if old := g.writers.Load(); old != nil {
		ws = slices.Clone(*old)
	}
	ws = append(ws, w)
	g.writers.Store(&ws)
}

// Remove takes w out of the group. A Hold taken before is still released.
func (g *Group) Remove(w *Writer) {
	g.mu.Lock()
	defer g.mu.Unlock()
	old := g.writers.Load()
	if old == nil {
		return
	}
	ws := slices.DeleteFunc(slices.Clone(*old), func(x *Writer) bool { return x == w })
	g.writers.Store(&ws)
}

// Hold holds every Writer of the group, and returns what Release takes:
// the Writers held, so that a Writer added meanwhile is not released.
func (g *Group) Hold() []*Writer {
	if g == nil {
		return nil
	}
	ws := g.writers.Load()
	if ws == nil {
		return nil
	}
	for _, w := range *ws {
		w.Hold()
	}
	return *ws
}

// Release releases the Writers a Hold returned.
func Release(held []*Writer) {
	for _, w := range held {
		w.Release()
	}
}
