package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"dnsproxi/guard"
)

// The files under deploy/ are checked here with the tools of their own
// ecosystems: promtool for the rules, a live scrape for every metric name
// the rules and the dashboard use, systemd-analyze for the unit. A tool
// that is missing fails the test rather than skipping it: .ci/run installs
// them (Debian's prometheus and systemd packages).

const (
	rulesFile     = "deploy/prometheus/dnsproxi.rules.yml"
	rulesTestFile = "deploy/prometheus/dnsproxi.rules_test.yml"
	dashboardFile = "deploy/grafana/dnsproxi.json"
)

// tool returns the path of the named program, or fails the test saying how
// to install it.
func tool(t *testing.T, name, debianPackage string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed (apt-get install -y %s; .ci/run does): %v", name, debianPackage, err)
	}
	return path
}

// runTool runs a program to completion (a minute at most) and returns its
// combined output.
func runTool(t *testing.T, stdin string, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The rules are valid, and their unit tests pass: each alert fires on the
// series fed to it, and stays silent on those meant to leave it silent.
func TestPrometheusRules(t *testing.T) {
	promtool := tool(t, "promtool", "prometheus")
	for _, args := range [][]string{{"check", "rules", rulesFile}, {"test", "rules", rulesTestFile}} {
		out, err := runTool(t, "", promtool, args...)
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		} else {
			t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
		}
	}
}

// liveScrape starts the proxy with every optional series on (the breaker,
// the query log), answers one query, and returns its /metrics page.
func liveScrape(t *testing.T) string {
	t.Helper()
	up := startUpstream(t)
	cfg := testConfig(up.Addr())
	cfg.MetricsAddr = "127.0.0.1:0"
	cfg.BreakerThreshold = 50
	cfg.QueryLog = QueryLogTarget(filepath.Join(t.TempDir(), "queries.log"))
	cfg.UpstreamRateLimit = RateLimit{Rate: 1e6, Burst: 1e6} // the outbound limit, the fleet's on Redis
	cfg.UpstreamRateLimitRedis = RedisURL(startRedisProc(t).URL())
	cfg.UpstreamRateLimitKey, cfg.UpstreamRateLimitTimeout = "dnsproxi-deploy-test", time.Second
	a := startProxy(t, cfg, guard.RealClock{})
	ask(t, "udp", a.addr(), query("www.example.com", dns.TypeA))
	return scrape(t, a)
}

// sampleNames returns the names of the samples on a /metrics page.
func sampleNames(page string) map[string]bool {
	names := map[string]bool{}
	for line := range strings.Lines(page) {
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names
}

// metricName matches the names of the proxy's and its runtime's series; a
// recording rule's name (dnsproxi:...) is not one.
var metricName = regexp.MustCompile(`\b(?:dnsproxi|go|process)_[a-z0-9_]*[a-z0-9]`)

// dashboardQueries returns every query of the dashboard: panel targets and
// template variables.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	var d struct {
		Panels []struct {
			Targets []struct{ Expr string } `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(readBytes(t, dashboardFile), &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var qs []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			qs = append(qs, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		qs = append(qs, v.Definition)
	}
	return qs
}

func readBytes(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Every metric name the dashboard's queries and the rules use is served by
// a live proxy: a renamed metric breaks the build, not the dashboard. The
// page itself passes promtool check metrics.
func TestDeployedMetricNamesExist(t *testing.T) {
	page := liveScrape(t)
	served := sampleNames(page)
	sources := map[string]string{
		dashboardFile: strings.Join(dashboardQueries(t), "\n"),
		rulesFile:     string(readBytes(t, rulesFile)),
	}
	for file, text := range sources {
		used := metricName.FindAllString(text, -1)
		if len(used) == 0 {
			t.Errorf("%s: no metric name found", file)
		}
		for _, name := range used {
			if !served[name] {
				t.Errorf("%s uses %s, which a live /metrics does not serve", file, name)
			}
		}
	}
	promtool := tool(t, "promtool", "prometheus")
	if out, err := runTool(t, page, promtool, "check", "metrics"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}

// The dashboard is one Grafana 10+ can import: a uid, its data source as a
// variable, and every panel drawing from it; and it shows what an operator
// looks for first.
func TestDashboardShape(t *testing.T) {
	var d struct {
		UID           string `json:"uid"`
		Title         string `json:"title"`
		SchemaVersion int    `json:"schemaVersion"`
		Templating    struct {
			List []struct{ Type, Name string } `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID         int    `json:"id"`
			Type       string `json:"type"`
			Title      string `json:"title"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
			GridPos struct{ X, Y, W, H int } `json:"gridPos"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(readBytes(t, dashboardFile), &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 36 {
		t.Errorf("uid %q, title %q, schemaVersion %d: want both set and a schema of Grafana 10 or later (≥ 36)", d.UID, d.Title, d.SchemaVersion)
	}
	if !slices.ContainsFunc(d.Templating.List, func(v struct{ Type, Name string }) bool {
		return v.Type == "datasource" && v.Name == "datasource"
	}) {
		t.Error("no datasource variable: the dashboard would be bound to one Grafana's data source")
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d used twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W < 1 || p.GridPos.X+p.GridPos.W > 24 || p.GridPos.H < 1 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: data source %q, %d queries: want ${datasource} and at least one", p.Title, p.Datasource.UID, len(p.Targets))
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if tg.Expr == "" || refs[tg.RefID] {
				t.Errorf("panel %q: query %q with refId %q empty or repeated", p.Title, tg.Expr, tg.RefID)
			}
			refs[tg.RefID] = true
		}
	}
	queries := strings.Join(dashboardQueries(t), "\n")
	for _, want := range []string{"dnsproxi_queries_total", "dnsproxi_request_duration_seconds_bucket", "dnsproxi_breaker_state",
		"dnsproxi_breaker_transitions_total", "dnsproxi_queries_in_flight", "go_goroutines", "process_resident_memory_bytes"} {
		if !slices.Contains(metricName.FindAllString(queries, -1), want) {
			t.Errorf("the dashboard does not show %s", want)
		}
	}
}
