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
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The recipe's DAGs (examples/recipes/airflow): airflowDAG streams (pipeline_dag.py);
// the other two chain the same tasks with Airflow's edges (sequential_dag.py), the files
// passing through Sluice or through a plain hostPath directory.
const (
	airflowDAG           = "sluice_pipeline"
	airflowSequentialDAG = "sluice_pipeline_sequential"
	airflowHostPathDAG   = "sluice_pipeline_hostpath"
)

// airflowHostDir is the directory on a node sluice_pipeline_hostpath's tasks share, one
// subdirectory per run's namespace (sequential_dag.py).
const airflowHostDir = "/var/tmp/sluice-airflow"

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
		for _, dag := range []string{airflowDAG, airflowSequentialDAG, airflowHostPathDAG} {
			if err := a.api(ctx, http.MethodGet, "/api/v2/dags/"+dag, nil, nil); err != nil {
				return err
			}
		}
		return nil
	}).WithContext(ctx).WithTimeout(3*time.Minute).WithPolling(2*time.Second).Should(Succeed(), "Airflow never served the recipe's DAGs")
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
		"import json, sys; sys.path.insert(0, sys.argv[1]); import pipeline_steps; print(json.dumps(pipeline_steps.STEPS))",
		filepath.Join(repoRoot, "examples", "recipes", "airflow"))
	cmd.Env = a.env
	out, err := cmd.Output()
	Expect(err).NotTo(HaveOccurred(), "reading STEPS of pipeline_steps.py")
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

// airflowRun is a DAG run as the REST API reports it once it ended: its state, when it
// started and ended, and its task instances.
type airflowRun struct {
	State     string     `json:"state"`
	StartDate *time.Time `json:"start_date"`
	EndDate   *time.Time `json:"end_date"`
	Tasks     []airflowTask
}

// makespan is the run's time from its start to its end.
func (r airflowRun) makespan() time.Duration {
	if r.StartDate == nil || r.EndDate == nil {
		return 0
	}
	return r.EndDate.Sub(*r.StartDate)
}

// run triggers a run of the recipe's DAG dag with conf and waits until it ends, within
// timeout; it returns the run with its task instances.
func (a *airflow) run(ctx context.Context, dag string, conf map[string]string, timeout time.Duration) airflowRun {
	GinkgoHelper()
	id := fmt.Sprintf("e2e-%d", time.Now().UnixNano())
	Expect(a.api(ctx, http.MethodPost, "/api/v2/dags/"+dag+"/dagRuns",
		map[string]any{"dag_run_id": id, "logical_date": nil, "conf": conf}, nil)).To(Succeed(), "triggering %s", dag)
	var run airflowRun
	Eventually(func() (string, error) {
		err := a.api(ctx, http.MethodGet, "/api/v2/dags/"+dag+"/dagRuns/"+id, nil, &run)
		return run.State, err
	}).WithContext(ctx).WithTimeout(timeout).WithPolling(2*time.Second).Should(BeElementOf("success", "failed"),
		"the DAG run %s of %s has not ended", id, dag)
	var tis struct {
		TaskInstances []airflowTask `json:"task_instances"`
	}
	Expect(a.api(ctx, http.MethodGet, "/api/v2/dags/"+dag+"/dagRuns/"+id+"/taskInstances", nil, &tis)).To(Succeed())
	run.Tasks = tis.TaskInstances
	fmt.Fprintf(GinkgoWriter, "DAG run %s of %s: %s in %v\n", id, dag, run.State, run.makespan())
	for _, t := range run.Tasks {
		fmt.Fprintf(GinkgoWriter, "  task %s: %s, %v to %v\n", t.TaskID, t.State, t.StartDate, t.EndDate)
	}
	return run
}

// hostPathResult returns result.txt of the sluice_pipeline_hostpath run in namespace ns
// on node, read by a pod on that node from the tasks' directory, which the pod then
// removes.
func hostPathResult(ctx context.Context, ns, node string) []byte {
	GinkgoHelper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "read-result"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			NodeSelector:  map[string]string{"kubernetes.io/hostname": node},
			Containers: []corev1.Container{{Name: "read", Image: image, ImagePullPolicy: pullPol,
				Command:      []string{"sh", "-c", `cat "/shared/$NS/result.txt" && rm -rf "/shared/$NS"`},
				Env:          []corev1.EnvVar{{Name: "NS", Value: ns}},
				VolumeMounts: []corev1.VolumeMount{{Name: "shared", MountPath: "/shared"}}}},
			Volumes: []corev1.Volume{{Name: "shared", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: airflowHostDir}}}},
		},
	}
	Expect(k8s.Create(ctx, pod)).To(Succeed())
	Eventually(func() (corev1.PodPhase, error) {
		err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), pod)
		return pod.Status.Phase, err
	}).WithContext(ctx).WithTimeout(2*time.Minute).WithPolling(time.Second).Should(Equal(corev1.PodSucceeded), "reading result.txt on node %s", node)
	b, err := clientset.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	Expect(err).NotTo(HaveOccurred())
	return b
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
		run := af.run(ctx, airflowDAG, map[string]string{"namespace": ns, "workflow": wf.Name}, 6*time.Minute)
		Expect(run.State).To(Equal("success"), "the DAG run")
		Expect(run.Tasks).To(HaveLen(len(pipelineOrder)))
		// The scheduler ran them at once: every task started before any ended.
		for _, t := range run.Tasks {
			Expect(t.State).To(Equal("success"), "task %s", t.TaskID)
			for _, u := range run.Tasks {
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
		run := af.run(ctx, airflowDAG, map[string]string{"namespace": ns, "workflow": wf.Name, "fail": "produce"}, 6*time.Minute)
		Expect(run.State).To(Equal("failed"), "the DAG run")
		Expect(run.Tasks).To(HaveLen(len(pipelineOrder)))
		for _, t := range run.Tasks {
			Expect(t.State).To(Equal("failed"), "task %s: its pod must exit non-zero once its input's producer failed", t.TaskID)
		}
		waitFailed(ctx, ns, wf.Name, 2*time.Minute)
	}, SpecTimeout(10*time.Minute))

	// The README's engine table: the same three tasks streaming through Sluice, chained
	// with Airflow's edges through Sluice, and chained through a plain hostPath directory
	// (no Sluice), one after the other in one Airflow, each result checked byte for byte.
	// The makespans are reported, not asserted (timing targets live in make bench).
	It("reports the pipeline's makespan streaming, and chained through Sluice and through a hostPath", func(ctx SpecContext) {
		want := pipelineReference(af.steps())
		streamNS, seqNS, hostNS := namespace(ctx, "airflow-stream"), namespace(ctx, "airflow-seq"), namespace(ctx, "airflow-host")
		stream, seq := recipeWorkflowFile("airflow", streamNS), recipeWorkflowFile("airflow", seqNS)
		Expect(k8s.Create(ctx, stream)).To(Succeed())
		Expect(k8s.Create(ctx, seq)).To(Succeed())

		streamed := af.run(ctx, airflowDAG, map[string]string{"namespace": streamNS, "workflow": stream.Name}, 6*time.Minute)
		Expect(streamed.State).To(Equal("success"), "the streaming DAG run")
		waitSucceeded(ctx, streamNS, stream.Name, 2*time.Minute)
		checkPipeline(ctx, stream, want)

		chained := af.run(ctx, airflowSequentialDAG, map[string]string{"namespace": seqNS, "workflow": seq.Name}, 8*time.Minute)
		Expect(chained.State).To(Equal("success"), "the chained DAG run through Sluice")
		waitSucceeded(ctx, seqNS, seq.Name, 2*time.Minute)
		Expect(objectAt(ctx, outputURI(ctx, seq, "result.txt"))).To(Equal(want), "result.txt of the chained run through Sluice")

		nodes := schedulableNodes(ctx)
		Expect(nodes).NotTo(BeEmpty(), "no Ready node takes pods")
		node := nodes[0]
		plain := af.run(ctx, airflowHostPathDAG, map[string]string{"namespace": hostNS, "node": node}, 8*time.Minute)
		Expect(plain.State).To(Equal("success"), "the chained DAG run through a hostPath")
		Expect(hostPathResult(ctx, hostNS, node)).To(Equal(want), "result.txt of the chained run through a hostPath")

		for _, r := range []airflowRun{streamed, chained, plain} {
			Expect(r.makespan()).To(BeNumerically(">", 0), "a DAG run without a start and end date")
		}
		AddReportEntry("Airflow makespan of the three-step pipeline", ReportEntryVisibilityAlways, fmt.Sprintf(
			"chained through a hostPath (Airflow's edges, no Sluice) %.1f s; chained through Sluice %.1f s; streaming through Sluice (no edges) %.1f s: %.2fx the hostPath run's speed",
			plain.makespan().Seconds(), chained.makespan().Seconds(), streamed.makespan().Seconds(),
			plain.makespan().Seconds()/streamed.makespan().Seconds()))
	}, SpecTimeout(25*time.Minute))
})
