package main

import (
	"bufio"
	"context"
	"errors"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

const (
	unitFile     = "deploy/systemd/dnsproxi.service"
	defaultsFile = "deploy/systemd/dnsproxi.default"
	unitBinary   = "/usr/local/bin/dnsproxi" // where the README installs it
)

// The unit passes systemd-analyze verify, run on a copy whose ExecStart
// names a freshly built binary (verify needs it to exist), and keeps the
// hardening the README promises.
func TestSystemdUnit(t *testing.T) {
	analyze := tool(t, "systemd-analyze", "systemd")
	unit := string(readBytes(t, unitFile))
	for _, want := range []string{
		"Type=notify",
		"ExecStart=" + unitBinary,
		"EnvironmentFile=-/etc/default/dnsproxi",
		"ExecReload=/bin/kill -HUP $MAINPID",
		"KillSignal=SIGTERM",
		"Restart=on-failure",
		"RestartPreventExitStatus=2",
		"DynamicUser=yes",
		"AmbientCapabilities=CAP_NET_BIND_SERVICE",
		"CapabilityBoundingSet=CAP_NET_BIND_SERVICE",
		"NoNewPrivileges=yes",
		"ProtectSystem=strict",
		"LogsDirectory=dnsproxi",
	} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(want) + `$`).MatchString(unit) {
			t.Errorf("%s lacks the line %s", unitFile, want)
		}
	}

	dir := t.TempDir()
	bin := buildBinary(t)
	copyPath := filepath.Join(dir, "dnsproxi.service")
	if err := os.WriteFile(copyPath, []byte(strings.ReplaceAll(unit, unitBinary, bin)), 0o644); err != nil {
		t.Fatal(err)
	}
	// verify exits 0 on a value it cannot parse and only says so: any
	// output is a failure.
	out, err := runTool(t, "", analyze, "verify", "--man=no", copyPath)
	if err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("systemd-analyze verify %s: %v\n%s", unitFile, err, out)
	}
	out, err = runTool(t, "", analyze, "security", "--offline=true", copyPath)
	if err != nil {
		t.Errorf("systemd-analyze security --offline=true: %v\n%s", err, out)
	}
	t.Logf("systemd-analyze security --offline=true:\n%s", out)
}

// noLookups is a resolver for configurations that must name no host.
type noLookups struct{}

func (noLookups) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	return nil, errors.New("the example must not depend on a lookup of " + host)
}

// The example /etc/default/dnsproxi is one dnsproxi accepts as it is, and
// with each example commented out in it turned on: every name a variable
// dnsproxi reads, every value within its rule.
func TestSystemdDefaultsFile(t *testing.T) {
	known := map[string]bool{}
	for i := range reflect.TypeFor[Config]().NumField() {
		known["DNS_"+reflect.TypeFor[Config]().Field(i).Tag.Get("envconfig")] = true
	}
	set, examples := map[string]string{}, []map[string]string{}
	assignment := regexp.MustCompile(`^(#)?(DNS_[A-Z0-9_]+)=(.*)$`)
	sc := bufio.NewScanner(strings.NewReader(string(readBytes(t, defaultsFile))))
	for sc.Scan() {
		m := assignment.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		if !known[m[2]] {
			t.Errorf("%s sets %s, which dnsproxi does not read", defaultsFile, m[2])
		}
		if m[1] == "" {
			set[m[2]] = m[3]
		} else {
			examples = append(examples, map[string]string{m[2]: m[3]})
		}
	}
	if len(set) == 0 || len(examples) == 0 {
		t.Fatalf("%s: %d variables set, %d examples: want some of each", defaultsFile, len(set), len(examples))
	}
	for _, extra := range append([]map[string]string{{}}, examples...) {
		env := maps.Clone(set)
		maps.Copy(env, extra)
		name := envString(extra)
		if name == "" {
			name = "as shipped"
		}
		t.Run(name, func(t *testing.T) {
			lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
			if _, err := readConfig(lookup, noLookups{}); err != nil {
				t.Errorf("%s: %v", defaultsFile, err)
			}
		})
	}
}

// The unit's file limit holds the largest configuration dnsproxi accepts:
// DNS_TCP_MAX_CONNS at the top of its range beside 16 upstreams, the
// metrics listener and a UDP socket for each of 64 cores. LimitNOFILE sets
// the hard limit too, beyond which Go cannot raise the soft one; at 65,536
// it was below systemd's own default (524,288), so a DNS_TCP_MAX_CONNS
// within the documented range stopped the service with exit 2.
func TestSystemdUnitFileLimitHoldsTheLargestConfiguration(t *testing.T) {
	m := regexp.MustCompile(`(?m)^LimitNOFILE=(\d+)$`).FindStringSubmatch(string(readBytes(t, unitFile)))
	if m == nil {
		t.Fatalf("%s sets no LimitNOFILE=<number>: the limit would be whatever the host's default is", unitFile)
	}
	limit, err := strconv.ParseUint(m[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	field, _ := reflect.TypeFor[Config]().FieldByName("TCPMaxConns")
	most, err := strconv.Atoi(field.Tag.Get("max"))
	if err != nil {
		t.Fatal(err)
	}
	ups := make([]string, 16)
	for i := range ups {
		ups[i] = "192.0.2." + strconv.Itoa(i+1) + ":53"
	}
	cfg := testConfig(strings.Join(ups, ","))
	cfg.MetricsAddr = "127.0.0.1:9398"
	cfg.TCPMaxConns = most
	if err := cfg.checkDescriptors(limit, 64); err != nil {
		t.Errorf("under the unit's LimitNOFILE=%d: %v", limit, err)
	}
}
