package sidecar

import (
	"bufio"
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/internal/testenv"
)

// metricName matches the Sluice metric names a PromQL expression uses.
var metricName = regexp.MustCompile(`\bsluice_[a-z_]+`)

// exported scrapes a serving sidecar's /metrics and returns the metric families it
// exports, with their types.
func exported(t *testing.T) map[string]string {
	t.Helper()
	_, _, cfgDir := backends(t, workflowYAML)
	p := newTestNode(t, "node-a").pod(t, "produce-0", "produce", 0, cfgDir)
	rec := httptest.NewRecorder()
	p.sc.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	types := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(rec.Body.String()))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			types[f[2]] = f[3]
		}
	}
	if err := p.sc.Drain(); err != nil {
		t.Fatal(err)
	}
	return types
}

// missing returns the Sluice metrics the expressions name that the sidecar does not export
// (a histogram's _bucket, _sum and _count series count as the histogram).
func missing(exprs []string, types map[string]string) []string {
	var out []string
	for _, e := range exprs {
		for _, name := range metricName.FindAllString(e, -1) {
			base := name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(name, suffix); ok && types[b] == "histogram" {
					base = b
				}
			}
			if _, ok := types[base]; !ok {
				out = append(out, name+" (in "+e+")")
			}
		}
	}
	return out
}

// Every metric the Grafana dashboard and the alert rules query is exported by a running
// sidecar, so that no panel stays empty and no alert can never fire because of a name.
func TestDashboardAndAlertsQueryExportedMetrics(t *testing.T) {
	testenv.Root(t, "the CSI node plugin mounts FUSE")
	types := exported(t)
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	b, err := os.ReadFile(filepath.Join("..", "deploy", "grafana", "sluice-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("deploy/grafana/sluice-dashboard.json: %v", err)
	}
	var exprs []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, m := range missing(exprs, types) {
		t.Errorf("the dashboard queries %s, which the sidecar does not export", m)
	}
	var rules struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	b, err = os.ReadFile(filepath.Join("..", "deploy", "prometheus", "sluice-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	exprs = nil
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	if len(exprs) < 3 {
		t.Errorf("%d alert rules, want the store, wait and upload alerts", len(exprs))
	}
	for _, m := range missing(exprs, types) {
		t.Errorf("an alert queries %s, which the sidecar does not export", m)
	}
}

// The alert rules pass promtool's checks and unit tests (deploy/prometheus/rules_test.yaml:
// each alert fires when it should and not before), and the PrometheusRule holds exactly
// the same rules.
func TestAlertRules(t *testing.T) {
	testenv.Integration(t, "promtool (hack/tools.sh)")
	dir := filepath.Join("..", "deploy", "prometheus")
	out, err := exec.Command(filepath.Join("..", "hack", "tools.sh"), "promtool").Output()
	if err != nil {
		t.Fatalf("hack/tools.sh promtool: %v", err)
	}
	promtool := strings.TrimSpace(string(out))
	for _, args := range [][]string{{"check", "rules", "sluice-rules.yaml"}, {"test", "rules", "rules_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	var plain, operator map[string]any
	for file, into := range map[string]*map[string]any{"sluice-rules.yaml": &plain, "prometheusrule.yaml": &operator} {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, into); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	if !equality.Semantic.DeepEqual(plain, operator["spec"]) {
		t.Error("prometheusrule.yaml's spec differs from sluice-rules.yaml")
	}
}
