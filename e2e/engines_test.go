//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// The engine specs (airflow_test.go) run a real workflow engine against the cluster: the engine's own scheduler starts the pods of the recipes in
// examples/recipes/<engine>, used as they are, and Sluice streams between them. They are
// labelled "engines" (make e2e-engines runs only them); hack/engines/ installs each
// engine, pinned and cached.

// pipelineOrder is the order the recipe's three steps run in on a plain directory.
var pipelineOrder = []string{"produce", "filter", "reduce"}

// pipelineReference runs the recipes' steps one after the other on a plain directory,
// with the busybox the cluster's image is made of (hack/cluster/local.sh copies
// /bin/busybox), /data in their commands replaced by the directory, and returns what
// they leave in result.txt.
func pipelineReference(steps map[string]string) []byte {
	GinkgoHelper()
	bb, err := exec.LookPath("busybox")
	Expect(err).NotTo(HaveOccurred(), "the reference run needs busybox, as the cluster's image")
	bin, dir := GinkgoT().TempDir(), GinkgoT().TempDir()
	list, err := exec.Command(bb, "--list").Output()
	Expect(err).NotTo(HaveOccurred())
	for _, applet := range strings.Fields(string(list)) {
		Expect(os.Symlink(bb, filepath.Join(bin, applet))).To(Succeed())
	}
	for _, step := range pipelineOrder {
		script, ok := steps[step]
		Expect(ok).To(BeTrue(), "the recipe has no step %s", step)
		cmd := exec.Command(filepath.Join(bin, "sh"), "-c", "set -eu -o pipefail\n"+strings.ReplaceAll(script, "/data", dir))
		cmd.Dir, cmd.Env = dir, []string{"PATH=" + bin, "FAIL="}
		out, err := cmd.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "step %s on a plain directory: %s", step, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "result.txt"))
	Expect(err).NotTo(HaveOccurred())
	return b
}

// checkPipeline checks a recipe's finished Workflow: result.txt byte for byte as on a
// plain directory, and the filter's first line read before the producer ended (its
// filter.first earlier than produce.end: both date +%s, on nodes that share a clock).
func checkPipeline(ctx context.Context, wf *v1alpha1.Workflow, want []byte) {
	GinkgoHelper()
	got := objectAt(ctx, outputURI(ctx, wf, "result.txt"))
	Expect(string(got)).To(Equal(string(want)), "result.txt differs from the same commands' on a plain directory")
	seconds := func(file string) int64 {
		b := objectAt(ctx, outputURI(ctx, wf, file))
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		Expect(err).NotTo(HaveOccurred(), "%s: %q", file, b)
		return n
	}
	first, end := seconds("filter.first"), seconds("produce.end")
	Expect(first).To(BeNumerically("<", end),
		"the filter read its first line at %d, not before the producer ended at %d: nothing streamed", first, end)
}

// waitFailed waits until the Workflow fails; it fails at once if it succeeds.
func waitFailed(ctx context.Context, ns, name string, timeout time.Duration) {
	GinkgoHelper()
	Eventually(func() (v1alpha1.WorkflowPhase, error) {
		phase, err := workflowPhase(ctx, ns, name)()
		if phase == v1alpha1.WorkflowSucceeded {
			return phase, StopTrying("Workflow " + ns + "/" + name + " succeeded")
		}
		return phase, err
	}).WithContext(ctx).WithTimeout(timeout).WithPolling(2 * time.Second).Should(Equal(v1alpha1.WorkflowFailed))
}

// recipeWorkflowFile reads examples/recipes/<engine>/workflow.yaml, for namespace ns.
func recipeWorkflowFile(engine, ns string) *v1alpha1.Workflow {
	GinkgoHelper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "examples", "recipes", engine, "workflow.yaml"))
	Expect(err).NotTo(HaveOccurred())
	wf := loadWorkflowYAML(string(b))
	wf.Namespace = ns
	return wf
}

// freePort returns a TCP port of the loopback interface nothing listens on.
func freePort() int {
	GinkgoHelper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// daemon is a process an engine spec started, in a process group of its own, its output
// in a log file.
type daemon struct {
	name, log string
	cmd       *exec.Cmd
	done      chan error
}

// startDaemon starts name (args...) with env, in dir, logging to dir/<name>.log.
func startDaemon(name, dir string, env []string, args ...string) *daemon {
	GinkgoHelper()
	d := &daemon{name: name, log: filepath.Join(dir, name+".log"), done: make(chan error, 1)}
	f, err := os.Create(d.log)
	Expect(err).NotTo(HaveOccurred())
	d.cmd = exec.Command(args[0], args[1:]...)
	d.cmd.Dir, d.cmd.Env, d.cmd.Stdout, d.cmd.Stderr = dir, env, f, f
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	Expect(d.cmd.Start()).To(Succeed(), "starting %s", name)
	go func() { d.done <- d.cmd.Wait(); f.Close() }()
	return d
}

// exited returns the daemon's exit if it has ended, nil if it runs.
func (d *daemon) exited() error {
	select {
	case err := <-d.done:
		d.done <- err
		if err == nil {
			return fmt.Errorf("%s exited", d.name)
		}
		return fmt.Errorf("%s: %w", d.name, err)
	default:
		return nil
	}
}

// stop ends the daemon's process group: SIGTERM, then SIGKILL after grace.
func (d *daemon) stop(grace time.Duration) {
	if d.exited() != nil {
		return
	}
	_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(grace):
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.done
	}
}

// tail prints the last lines of the daemon's log to the spec's output.
func (d *daemon) tail(lines int) {
	b, _ := os.ReadFile(d.log)
	all := strings.Split(string(b), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	fmt.Fprintf(GinkgoWriter, "\n----- last %d lines of %s -----\n%s\n", lines, d.log, strings.Join(all, "\n"))
}
