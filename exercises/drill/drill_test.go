package main

import (
	"bytes"
	"strings"
	"testing"
)

// Each drill runs in its quick form against the real binary and a fake
// upstream on loopback; the test checks the report's key numbers.
func TestDrills(t *testing.T) {
	if testing.Short() {
		t.Skip("the drills build and run the real binary")
	}
	checks := map[string]func(t *testing.T, n map[string]int){
		"ratelimit": func(t *testing.T, n map[string]int) {
			if n["rate_limited"] == 0 || n["forwarded"] != 0 || n["upstream"]+n["coalesced"] != n["upstream_error"] {
				t.Errorf("ratelimit numbers %v", n)
			}
		},
		"breaker": func(t *testing.T, n map[string]int) {
			if n["trip_errors"] < 20 || n["open_fast"] != 5 || n["probe_packets"] != 1 || n["closed_ok"] != 20 {
				t.Errorf("breaker numbers %v", n)
			}
		},
		"flap": func(t *testing.T, n map[string]int) {
			if n["opened"] < 2 || n["closed_again"] < 1 || n["spared"] == 0 {
				t.Errorf("flap numbers %v", n)
			}
		},
		"slow": func(t *testing.T, n map[string]int) {
			if n["breaker_open"] == 0 || n["fast_with"] <= n["fast_without"] {
				t.Errorf("slow numbers %v", n)
			}
		},
		"slownames": func(t *testing.T, n map[string]int) {
			if n["slow_servfail"] != 40 || n["neighbours_ok"] != 10 || n["opened_slow"] != 0 || n["refused_slow"] != 0 ||
				n["dark_errors"] != 20 || n["opened"] != 1 || n["open_fast"] != 5 {
				t.Errorf("slownames numbers %v", n)
			}
		},
		"fairness": func(t *testing.T, n map[string]int) {
			if n["global_polite_pct"] >= 50 || n["fair_polite_pct"] < 99 || n["slip_polite_pct"] < 99 ||
				n["fair_flood_ok"] > n["quota"]+1 || n["slip_tc"] == 0 || n["slip_tc"] > n["slip_refused"]/2+1 ||
				n["slip_tcp_ok"] > n["quota"]+1 || n["slip_tcp_ok"] < n["tcp_floor"] {
				t.Errorf("fairness numbers %v", n)
			}
		},
		"failover": func(t *testing.T, n map[string]int) {
			if n["dead_answered"]*100 < 97*n["dead_total"] || n["tripped"] != 1 || n["closed_again"] != 1 ||
				n["after_second"] != 0 || n["after_first"] == 0 || n["storm_ratio_milli"] == 0 || n["storm_ratio_milli"] > 1130 ||
				n["storm_after_packets"] > n["storm_probes"] {
				t.Errorf("failover numbers %v", n)
			}
		},
		"degrade": func(t *testing.T, n map[string]int) {
			if n["primed"] != 50 || n["first_stale"] != 50 || n["known_stale"] != n["known_asked"] || n["known_asked"] != 150 ||
				n["known_fast"] < n["known_asked"]-n["probes"] || n["unknown_servfail"] != 20 || n["outage_packets"] != n["probes"] ||
				n["healed_new_ok"] != 20 || n["flushed_fresh"] != 50 || n["nocache_first_ok"] != 0 || n["nocache_known_ok"] != 0 ||
				n["nocache_healed_ok"] != 20 {
				t.Errorf("degrade numbers %v", n)
			}
		},
		"fleet": func(t *testing.T, n map[string]int) {
			if n["local_x100"] < 240 || n["shared_x100"] < 70 || n["shared_upstream"] > n["shared_bound"] ||
				n["stopped_x100"] < 60 || n["stopped_upstream"] > n["stopped_bound"] {
				t.Errorf("fleet numbers %v", n)
			}
		},
		"overload": func(t *testing.T, n map[string]int) {
			if n["forwarded"] < 120 || n["forwarded"] > 175 || n["first"] <= n["last"] {
				t.Errorf("overload numbers %v", n)
			}
		},
	}
	for i, d := range drills {
		t.Run(d.name, func(t *testing.T) {
			var out bytes.Buffer
			r, err := runDrill(i, quickScale, &out)
			if err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			if len(r.failures) > 0 {
				t.Errorf("the drill failed: %s", strings.Join(r.failures, "; "))
			}
			checks[d.name](t, r.numbers)
			if t.Failed() {
				t.Logf("report:\n%s", out.String())
			}
		})
	}
}

func TestCLI(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := cli(nil, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "ratelimit") {
		t.Errorf("no arguments: exit %d, usage %q", code, errOut.String())
	}
	errOut.Reset()
	if code := cli([]string{"nosuch"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), `unknown drill "nosuch"`) {
		t.Errorf("unknown drill: exit %d, %q", code, errOut.String())
	}
	errOut.Reset()
	if code := cli([]string{"upstream", "-mode", "sideways"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "unknown mode") {
		t.Errorf("bad mode: exit %d, %q", code, errOut.String())
	}
	errOut.Reset()
	if code := cli([]string{"upstream", "-addr", "192.0.2.1:53"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "not a loopback") {
		t.Errorf("non-loopback address: exit %d, %q", code, errOut.String())
	}
}
