//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// airflowDAG is the DAG of examples/recipes/airflow/pipeline_dag.py.
const airflowDAG = "sluice_pipeline"

// airflow is an Airflow 3 installation (hack/engines/airflow.sh) run as Airflow runs in
// production: its own scheduler (LocalExecutor, which runs tasks at once), DAG processor
// (reading examples/recipes/airflow as it is) and API server, on SQLite, against the
// cluster's kubeconfig.
type airflow struct {
	venv, home, url string
	env             []string
	daemons         []*daemon
}

// startAirflow installs Airflow if it is not cached, starts it, and waits until it has
// parsed the recipe's DAG; it is stopped after the spec's container.
func startAirflow(ctx context.Context) *airflow {
	GinkgoHelper()
	out, err := exec.Command(filepath.Join(repoRoot, "hack", "engines", "airflow.sh"), "install").Output()
	Expect(err).NotTo(HaveOccurred(), "installing Airflow (hack/engines/airflow.sh install)")
	a := &airflow{venv: strings.TrimSpace(string(out)), home: GinkgoT().TempDir()}
	port := freePort()
	a.url = fmt.Sprintf("http://127.0.0.1:%d", port)
	a.env = append(os.Environ(),
		"PATH="+filepath.Join(a.venv, "bin")+":"+os.Getenv("PATH"),
		"AIRFLOW_HOME="+a.home,
		"AIRFLOW__CORE__DAGS_FOLDER="+filepath.Join(repoRoot, "examples", "recipes", "airflow"),
		"AIRFLOW__CORE__LOAD_EXAMPLES=False",
		"AIRFLOW__CORE__EXECUTOR=LocalExecutor",
		"AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=False",
		"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=True",
		fmt.Sprintf("AIRFLOW__API__PORT=%d", port),
		"AIRFLOW__CORE__EXECUTION_API_SERVER_URL="+a.url+"/execution/",
		"SLUICE_RECIPE_IMAGE="+image,
		"SLUICE_RECIPE_PULL_POLICY="+string(pullPol),
	)
	migrate := exec.CommandContext(ctx, filepath.Join(a.venv, "bin", "airflow"), "db", "migrate")
	migrate.Env, migrate.Dir = a.env, a.home
	b, err := migrate.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "airflow db migrate: %s", b)
	bin := filepath.Join(a.venv, "bin", "airflow")
	for _, args := range [][]string{{"scheduler"}, {"dag-processor"}, {"api-server", "--port", fmt.Sprint(port)}} {
		a.daemons = append(a.daemons, startDaemon("airflow-"+args[0], a.home, a.env, append([]string{bin}, args...)...))
	}
	DeferCleanup(func() {
		if CurrentSpecReport().Failed() {
			for _, d := range a.daemons {
				d.tail(40)
			}
		}
		for _, d := range a.daemons {
			d.stop(30 * time.Second)
		}
	})
	Eventually(func() error {
		for _, d := range a.daemons {
			if err := d.exited(); err != nil {
				return StopTrying(err.Error())
			}
		}
		return a.api(ctx, http.MethodGet, "/api/v2/dags/"+airflowDAG, nil, nil)
	}).WithContext(ctx).WithTimeout(3*time.Minute).WithPolling(2*time.Second).Should(Succeed(), "Airflow never served the DAG %s", airflowDAG)
	return a
}

// api calls Airflow's REST API (all users admins: no token needed), sending in as JSON
// and decoding the answer into out when not nil.
func (a *airflow) api(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.url+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, b)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(b, out)
}

// steps returns the recipe's STEPS, its shell commands by step, as the DAG file defines
// them (imported by the installation's Python).
func (a *airflow) steps() map[string]string {
	GinkgoHelper()
	cmd := exec.Command(filepath.Join(a.venv, "bin", "python"), "-c",
		"import json, sys; sys.path.insert(0, sys.argv[1]); import pipeline_dag; print(json.dumps(pipeline_dag.STEPS))",
		filepath.Join(repoRoot, "examples", "recipes", "airflow"))
	cmd.Env = a.env
	out, err := cmd.Output()
	Expect(err).NotTo(HaveOccurred(), "reading STEPS of pipeline_dag.py")
	var steps map[string]string
	Expect(json.Unmarshal(out, &steps)).To(Succeed())
	return steps
}

// airflowTask is a task instance of a DAG run, as the REST API reports it.
type airflowTask struct {
	TaskID    string     `json:"task_id"`
	State     string     `json:"state"`
	StartDate *time.Time `json:"start_date"`
	EndDate   *time.Time `json:"end_date"`
}

// run triggers a run of the recipe's DAG with conf and waits until it ends, within
// timeout; it returns the run's state and its task instances.
func (a *airflow) run(ctx context.Context, conf map[string]string, timeout time.Duration) (string, []airflowTask) {
	GinkgoHelper()
	id := fmt.Sprintf("e2e-%d", time.Now().UnixNano())
	Expect(a.api(ctx, http.MethodPost, "/api/v2/dags/"+airflowDAG+"/dagRuns",
		map[string]any{"dag_run_id": id, "logical_date": nil, "conf": conf}, nil)).To(Succeed(), "triggering %s", airflowDAG)
	var run struct {
		State string `json:"state"`
	}
	Eventually(func() (string, error) {
		err := a.api(ctx, http.MethodGet, "/api/v2/dags/"+airflowDAG+"/dagRuns/"+id, nil, &run)
		return run.State, err
	}).WithContext(ctx).WithTimeout(timeout).WithPolling(2*time.Second).Should(BeElementOf("success", "failed"),
		"the DAG run %s has not ended", id)
	var tis struct {
		TaskInstances []airflowTask `json:"task_instances"`
	}
	Expect(a.api(ctx, http.MethodGet, "/api/v2/dags/"+airflowDAG+"/dagRuns/"+id+"/taskInstances", nil, &tis)).To(Succeed())
	fmt.Fprintf(GinkgoWriter, "DAG run %s: %s\n", id, run.State)
	for _, t := range tis.TaskInstances {
		fmt.Fprintf(GinkgoWriter, "  task %s: %s, %v to %v\n", t.TaskID, t.State, t.StartDate, t.EndDate)
	}
	return run.State, tis.TaskInstances
}

var _ = Describe("Airflow 3 runs a streaming DAG", Ordered, Label("engines", "airflow"), func() {
	var af *airflow
	BeforeAll(func(ctx SpecContext) {
		af = startAirflow(ctx)
	}, NodeTimeout(8*time.Minute))

	It("streams produce → filter → reduce, three KubernetesPodOperator tasks at once", func(ctx SpecContext) {
		ns := namespace(ctx, "airflow")
		wf := recipeWorkflowFile("airflow", ns)
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		state, tasks := af.run(ctx, map[string]string{"namespace": ns, "workflow": wf.Name}, 6*time.Minute)
		Expect(state).To(Equal("success"), "the DAG run")
		Expect(tasks).To(HaveLen(len(pipelineOrder)))
		// The scheduler ran them at once: every task started before any ended.
		for _, t := range tasks {
			Expect(t.State).To(Equal("success"), "task %s", t.TaskID)
			for _, u := range tasks {
				Expect(t.StartDate.Before(*u.EndDate)).To(BeTrue(), "task %s started after %s ended", t.TaskID, u.TaskID)
			}
		}
		waitSucceeded(ctx, ns, wf.Name, 2*time.Minute)
		checkPipeline(ctx, wf, pipelineReference(af.steps()))
	}, SpecTimeout(10*time.Minute))

	It("fails the DAG run when the producer fails: its consumers fail, none hangs", func(ctx SpecContext) {
		ns := namespace(ctx, "airflow-fail")
		wf := recipeWorkflowFile("airflow", ns)
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		state, tasks := af.run(ctx, map[string]string{"namespace": ns, "workflow": wf.Name, "fail": "produce"}, 6*time.Minute)
		Expect(state).To(Equal("failed"), "the DAG run")
		Expect(tasks).To(HaveLen(len(pipelineOrder)))
		for _, t := range tasks {
			Expect(t.State).To(Equal("failed"), "task %s: its pod must exit non-zero once its input's producer failed", t.TaskID)
		}
		waitFailed(ctx, ns, wf.Name, 2*time.Minute)
	}, SpecTimeout(10*time.Minute))
})
