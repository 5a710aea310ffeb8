//go:build pprof

package main

// Built with -tags pprof, dnsproxi serves the runtime profiles on
// 127.0.0.1:6060/debug/pprof/ for profiling under load. Never in a release.

import (
	"net/http"
	_ "net/http/pprof"
)

func init() {
	go http.ListenAndServe("127.0.0.1:6060", nil)
}
