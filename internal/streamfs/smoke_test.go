package streamfs

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
)

func TestSmoke(t *testing.T) {
	var spec v1alpha1.WorkflowSpec
	yaml.Unmarshal([]byte(`
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose}, fire: NoUpdate}]
- name: c
`), &spec)
	rs, errs, _ := semantics.Compile(&spec)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	eng := semantics.NewEngine(rs)
	dir := t.TempDir()
	st, _ := store.New(filepath.Join(dir, "store"), store.Options{})
	os.MkdirAll(filepath.Join(dir, "p"), 0o755)
	os.MkdirAll(filepath.Join(dir, "c"), 0o755)
	pv, err := Mount(filepath.Join(dir, "p"), st, eng, Options{Step: "p"})
	if err != nil {
		t.Fatal(err)
	}
	defer pv.Unmount()
	cv, err := Mount(filepath.Join(dir, "c"), st, eng, Options{Step: "c", WaitTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cv.Unmount()
	cat := exec.Command("cat", filepath.Join(dir, "c", "f"))
	start := time.Now()
	done := make(chan []byte)
	go func() { out, err := cat.CombinedOutput(); t.Log(err); done <- out }()
	time.Sleep(200 * time.Millisecond)
	if err := os.WriteFile(filepath.Join(dir, "p", "f"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := <-done
	t.Logf("cat got %q after %v", out, time.Since(start))
}
