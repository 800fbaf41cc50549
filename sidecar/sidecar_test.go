package sidecar

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	csidriver "github.com/sluice-io/sluice/csi-driver"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/published"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/servers"
	"github.com/sluice-io/sluice/internal/storeserver"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/internal/testutil"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

const workflowYAML = `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: wf, namespace: ns1}
spec:
  permanent: [result.txt]
  steps:
  - name: produce
    outputs:
    - {path: stream.bin, commit: {rule: OnClose}, fire: NoUpdate}
    - {path: result.txt}
  - name: consume
    replicas: 2
    inputs: [stream.bin, result.txt]
`

// testNode is one Kubernetes node: its CSI node plugin.
type testNode struct {
	name string
	d    *csidriver.Driver
	dir  string
}

func newTestNode(t *testing.T, name string) *testNode {
	t.Helper()
	return newTestNodeWith(t, name, csidriver.Options{})
}

// newTestNodeWith is newTestNode with the plugin's options opts (its node ID, state
// directory and sidecar user are the test's); mounts it leaves are unmounted.
func newTestNodeWith(t *testing.T, name string, opts csidriver.Options) *testNode {
	t.Helper()
	testenv.Root(t, "the CSI node plugin mounts FUSE")
	dir := t.TempDir()
	t.Cleanup(func() { _ = exec.Command("umount", "-R", "-l", filepath.Join(dir, "state", "store")).Run() })
	opts.NodeID, opts.StateDir, opts.SidecarUID, opts.SidecarGID = name, filepath.Join(dir, "state"), os.Getuid(), os.Getgid()
	if opts.DiskTier == "" {
		opts.DiskTier = csidriver.DiskTierDirectory // the plugin's own tests cover file systems
	}
	d, err := csidriver.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return &testNode{name: name, d: d, dir: dir}
}

// testWorkflowUID is the metadata.uid of the tests' workflows, as the API server gives
// every Workflow one.
const testWorkflowUID = "0f1e2d3c-4b5a"

// serveStore starts the node's store server of workflow ns/wf, as the CSI node plugin
// does for a workflow it published (its record) whose agent Secret the controller made,
// for the test's duration; the test's API server has the workflow of the sidecars'
// configuration in cfgDir, and its agent Secret their NATS connection.
func (n *testNode) serveStore(t *testing.T, ns, wf, cfgDir string) {
	t.Helper()
	cfg, err := podconfig.Load(cfgDir)
	if err != nil {
		t.Fatal(err)
	}
	// The test's plugin checks no marks, so it records no publication itself.
	if err := published.Record(n.d.RecordDir(ns, wf), string(cfg.Workflow.UID)); err != nil {
		t.Fatal(err)
	}
	servers := storeserver.New(storeserver.Options{
		Node: n.name, Log: testr.New(t), DiskOf: n.d.DiskDirOf, RecordOf: n.d.RecordDirOf,
		Workflow: func(context.Context, string, string) (*v1alpha1.Workflow, error) {
			return cfg.Workflow.DeepCopy(), nil
		},
		Connection: func(context.Context, *v1alpha1.Workflow) (*podconfig.Connection, error) {
			return &podconfig.Connection{URL: cfg.NATSURL, Creds: cfg.NATSCreds, Inbox: cfg.NATSInbox, CA: cfg.CA}, nil
		},
	})
	t.Cleanup(servers.StopAll)
	if err := servers.Ensure(context.Background(), n.d.WorkflowDir(ns, wf)); err != nil || len(servers.Running()) != 1 {
		t.Fatalf("%s's store server: %v (%d running)", n.name, err, len(servers.Running()))
	}
}

// testPod is a pod with its two volumes published and its sidecar serving.
type testPod struct {
	name string
	app  string // where the app containers see the volume
	sc   *Sidecar
}

// pod publishes the volumes of a pod of step[instance] on the node, as the kubelet does
// for an injected pod, and starts its sidecar with the workflow's configuration in cfg.
func (n *testNode) pod(t *testing.T, name, step string, instance int, cfg string) *testPod {
	t.Helper()
	return n.podMode(t, name, step, instance, cfg, v1alpha1.ModeFUSE)
}

// podMode is pod with the volume attribute mode (fuse or direct); tweaks change the
// sidecar's options.
func (n *testNode) podMode(t *testing.T, name, step string, instance int, cfg, mode string, tweaks ...func(*Options)) *testPod {
	t.Helper()
	app, control := n.publishPod(t, name, step, instance, mode)
	opts := Options{ControlDir: control, ConfigDir: cfg, AttachWait: 10 * time.Second, SpaceWait: time.Second}
	for _, tweak := range tweaks {
		tweak(&opts)
	}
	sc, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("starting the sidecar of %s: %v", name, err)
	}
	if mode == v1alpha1.ModeFUSE {
		// This process serves the mount and opens files on it: the kernel must know the
		// server has no POLL before the runtime registers one of them.
		if err := disablePoll(app); err != nil {
			t.Fatal(err)
		}
	}
	return &testPod{name: name, app: app, sc: sc}
}

// publishPod publishes the two volumes of a pod of step[instance] on the node, as the
// kubelet does for an injected pod, and returns where the app containers and the sidecar
// see them.
func (n *testNode) publishPod(t *testing.T, name, step string, instance int, mode string) (app, control string) {
	t.Helper()
	uid := "uid-" + name
	publish := func(role string) string {
		target := filepath.Join(n.dir, "kubelet", uid, role)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			t.Fatal(err)
		}
		_, err := n.d.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{
			VolumeId: "csi-" + uid + "-" + role, TargetPath: target,
			VolumeCapability: &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}},
			VolumeContext: map[string]string{
				"csi.storage.k8s.io/ephemeral": "true", "csi.storage.k8s.io/pod.namespace": "ns1",
				"csi.storage.k8s.io/pod.name": name, "csi.storage.k8s.io/pod.uid": uid,
				v1alpha1.VolumeAttrWorkflow: "wf", v1alpha1.VolumeAttrStep: step, v1alpha1.VolumeAttrInstance: strconv.Itoa(instance),
				v1alpha1.VolumeAttrRole: role, v1alpha1.VolumeAttrMode: mode,
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if _, err := n.d.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: target}); err != nil {
				t.Error(err)
			}
		})
		return target
	}
	return publish(v1alpha1.RoleApp), publish(v1alpha1.RoleSidecar)
}

// backends starts NATS and MinIO (bucket "results") for the workflow in yamlText, and
// writes the configuration Secret's files the controller would give its pods into a
// directory, which it returns.
func backends(t *testing.T, yamlText string) (string, *servers.MinIO, string) {
	t.Helper()
	testenv.Integration(t, "an embedded nats-server and MinIO")
	natsURL := testutil.NATS(t)
	mio, err := servers.StartMinIO(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mio.Stop)
	if _, err := mio.Bucket(context.Background(), "results"); err != nil {
		t.Fatal(err)
	}
	var wf v1alpha1.Workflow
	if err := yaml.UnmarshalStrict([]byte(yamlText), &wf); err != nil {
		t.Fatal(err)
	}
	if wf.UID == "" {
		wf.UID = testWorkflowUID // as the API server gives every Workflow one
	}
	cfg := &podconfig.Config{Workflow: &wf, NATSURL: natsURL,
		Storage: &podconfig.Storage{Endpoint: mio.Endpoint, Bucket: "results", Prefix: "wf/", AccessKey: mio.AccessKey, SecretKey: mio.SecretKey}}
	data, err := cfg.Data()
	if err != nil {
		t.Fatal(err)
	}
	cfgDir := t.TempDir()
	for k, v := range data {
		if err := os.WriteFile(filepath.Join(cfgDir, k), v, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return natsURL, mio, cfgDir
}

// readAll reads a file of the pod's volume to EOF in the background.
func (p *testPod) readAll(name string) <-chan []byte {
	ch := make(chan []byte, 1)
	go func() {
		f, err := os.Open(filepath.Join(p.app, name))
		if err != nil {
			ch <- []byte("open: " + err.Error())
			return
		}
		defer f.Close()
		b, err := io.ReadAll(f)
		if err != nil {
			b = append(b, []byte("read: "+err.Error())...)
		}
		ch <- b
	}()
	return ch
}

func receive(t *testing.T, what string, ch <-chan []byte) []byte {
	t.Helper()
	select {
	case b := <-ch:
		return b
	case <-time.After(60 * time.Second):
		t.Fatalf("%s: no EOF after 60 s", what)
		return nil
	}
}

// Three pods of one workflow on two nodes, each served by its sidecar through the CSI
// node plugin's hand-off: the producer streams a NoUpdate file to a consumer on its node
// (through the node store, nothing fetched from NATS) and to one on the other node (over
// NATS); its OnTermination output commits when its sidecar drains after the app exits,
// and lands in object storage byte for byte.
func TestPodsStreamThroughTheirSidecars(t *testing.T) {
	testenv.Root(t, "the CSI node plugin mounts FUSE")
	ctx := context.Background()
	nsrv, mio, cfgDir := backends(t, workflowYAML)

	a, b := newTestNode(t, "node-a"), newTestNode(t, "node-b")
	prod := a.pod(t, "produce-0", "produce", 0, cfgDir)
	near := a.pod(t, "consume-0", "consume", 0, cfgDir)
	far := b.pod(t, "consume-1", "consume", 1, cfgDir)

	nearStream, farStream := near.readAll("stream.bin"), far.readAll("stream.bin")
	nearResult, farResult := near.readAll("result.txt"), far.readAll("result.txt")

	stream := make([]byte, 8<<20+5)
	rand.Read(stream)
	if err := os.WriteFile(filepath.Join(prod.app, "stream.bin"), stream, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what string
		ch   <-chan []byte
	}{{"consumer on the producer's node", nearStream}, {"consumer on the other node", farStream}} {
		if got := receive(t, c.what, c.ch); !bytes.Equal(got, stream) {
			t.Fatalf("%s read %d bytes (%.60q), want the %d written", c.what, len(got), got, len(stream))
		}
	}

	result := []byte("the producer's result\n")
	if err := os.WriteFile(filepath.Join(prod.app, "result.txt"), result, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-nearResult:
		t.Fatalf("result.txt (OnTermination) was readable before the producer terminated: %q", got)
	default:
	}
	// /metrics and /readyz of the producer's sidecar, while it serves.
	rec := httptest.NewRecorder()
	prod.sc.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if got, want := metric(rec.Body.String(), `sluice_volume_written_bytes_total{instance="0",node="node-a",step="produce",workflow="wf"}`), float64(len(stream)+len(result)); got != want {
		t.Errorf("/metrics counts %v bytes written by the producer, want %v", got, want)
	}
	rec = httptest.NewRecorder()
	prod.sc.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != 200 {
		t.Errorf("/readyz = %d while serving", rec.Code)
	}

	// The app container exits; the kubelet sends the sidecar SIGTERM.
	if err := prod.sc.Drain(); err != nil {
		t.Fatalf("draining the producer's sidecar: %v", err)
	}
	for _, c := range []struct {
		what string
		ch   <-chan []byte
	}{{"consumer on the producer's node", nearResult}, {"consumer on the other node", farResult}} {
		if got := receive(t, c.what, c.ch); !bytes.Equal(got, result) {
			t.Fatalf("%s read result.txt = %q, want %q", c.what, got, result)
		}
	}
	obj, err := mio.Object(ctx, "results", "wf/result.txt")
	if err != nil || !bytes.Equal(obj, result) {
		t.Fatalf("object storage holds %q (%v), want the committed result", obj, err)
	}
	if got := prod.sc.node.Peer.Counters().BytesReceived + near.sc.node.Peer.Counters().BytesReceived; got != 0 {
		t.Errorf("the producer's node fetched %d bytes from NATS; co-located pods share its store", got)
	}
	if got, want := far.sc.node.Peer.Counters().BytesReceived, int64(len(stream)+len(result)); got != want {
		t.Errorf("the other node received %d bytes, want %d", got, want)
	}
	for _, p := range []*testPod{near, far} {
		if err := p.sc.Drain(); err != nil {
			t.Errorf("draining %s: %v", p.name, err)
		}
	}
	// Each sidecar recorded its pod's counters for the Workflow's status: only the other
	// node received bytes.
	checkReceived(t, nsrv, map[string]int64{"produce-0": 0, "consume-0": 0, "consume-1": int64(len(stream) + len(result))})

	// Every pod of node-a has ended. A pod started later on a third node (instance 1
	// retried there) still reads what node-a's producer wrote: node-a's CSI node plugin
	// serves the node store, with the connection its sidecars deposited.
	a.serveStore(t, "ns1", "wf", cfgDir)
	late := newTestNode(t, "node-c").pod(t, "consume-1-retry", "consume", 1, cfgDir)
	if got := receive(t, "a pod on node-c after node-a's pods ended", late.readAll("stream.bin")); !bytes.Equal(got, stream) {
		t.Fatalf("the late pod read %d bytes of stream.bin, want the %d written", len(got), len(stream))
	}
	if got := late.sc.node.Peer.Counters().BytesReceived; got != int64(len(stream)) {
		t.Errorf("node-c received %d bytes, want %d (the file it read)", got, len(stream))
	}
	if err := late.sc.Drain(); err != nil {
		t.Errorf("draining %s: %v", late.name, err)
	}
}

// jetStreamOf connects to the test's NATS server for the test's duration.
func jetStreamOf(t *testing.T, natsURL string) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(testutil.Connect(t, natsURL))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// checkReceived checks the bytes received from other nodes that each pod's sidecar
// recorded in the workflow's KV bucket (wfmeta.PodStats), by pod name.
func checkReceived(t *testing.T, natsURL string, want map[string]int64) {
	t.Helper()
	js := jetStreamOf(t, natsURL)
	md, err := wfmeta.Metadata(context.Background(), js, wfmeta.NamesForWorkflow("ns1", "wf", testWorkflowUID))
	if err != nil {
		t.Fatal(err)
	}
	received := map[string]int64{}
	for _, p := range md.Pods {
		received[p.Pod] = p.BytesReceived
	}
	if !maps.Equal(received, want) {
		t.Errorf("pods' recorded counters %v, want %v", received, want)
	}
}

// metric returns the value of the series named (with its labels) in a Prometheus text
// exposition, or -1.
func metric(body, series string) float64 {
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

const adoptionYAML = `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: wf, namespace: ns1}
spec:
  permanent: ["sums/*"]
  steps:
  - name: sum
    replicas: 2
    outputs:
    - {path: sums, type: Directory, commit: {rule: OnTermination}}
`

// Two instances write into a directory that commits OnTermination, that is when both have
// exited: the first pod's file commits after its sidecar has gone. A pod still running
// (here on another node) adopts it, so both files are recorded and stored byte for byte.
func TestFilesOfExitedPodsAreAdopted(t *testing.T) {
	testenv.Root(t, "the CSI node plugin mounts FUSE")
	ctx := context.Background()
	nsrv, mio, cfgDir := backends(t, adoptionYAML)
	nodeA := newTestNode(t, "node-a")
	first := nodeA.pod(t, "sum-0", "sum", 0, cfgDir)
	last := newTestNode(t, "node-b").pod(t, "sum-1", "sum", 1, cfgDir)
	want := map[string][]byte{"sums/0.txt": []byte("5000050000\n"), "sums/1.txt": []byte("42\n")}
	for _, p := range []*testPod{first, last} {
		if err := os.MkdirAll(filepath.Join(p.app, "sums"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(first.app, "sums/0.txt"), want["sums/0.txt"], 0o644); err != nil {
		t.Fatal(err)
	}
	if err := first.sc.Drain(); err != nil {
		t.Fatalf("draining the first pod: %v", err)
	}
	// node-a's CSI node plugin serves its store from now on: the adopting node fetches
	// the first pod's file from there.
	nodeA.serveStore(t, "ns1", "wf", cfgDir)
	if err := os.WriteFile(filepath.Join(last.app, "sums/1.txt"), want["sums/1.txt"], 0o644); err != nil {
		t.Fatal(err)
	}
	if err := last.sc.Drain(); err != nil {
		t.Fatalf("draining the last pod: %v", err)
	}
	for key, b := range want {
		obj, err := mio.Object(ctx, "results", "wf/"+key)
		if err != nil || !bytes.Equal(obj, b) {
			t.Errorf("object storage holds %q for %s (%v), want %q", obj, key, err, b)
		}
	}
	js := jetStreamOf(t, nsrv)
	md, err := wfmeta.Metadata(ctx, js, wfmeta.NamesForWorkflow("ns1", "wf", testWorkflowUID))
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[string]string{}
	for _, f := range md.Files {
		recorded[f.Path] = f.Home
	}
	if recorded["sums/0.txt"] != "sum-1" || recorded["sums/1.txt"] != "sum-1" {
		t.Errorf("commits recorded with homes %v, want both sums by the pod still running (sum-1)", recorded)
	}
}

// A failed attempt's sidecar, told by the controller that the app failed, does not
// record the instance's termination: the OnTermination file the attempt wrote stays
// unreadable, and the retry's version commits when the retry's sidecar drains after a
// success. Without an outcome in time, the sidecar records the termination anyway.
func TestOnlySucceededAttemptsTerminate(t *testing.T) {
	testenv.Root(t, "the CSI node plugin mounts FUSE")
	ctx := context.Background()
	nsrv, _, cfgDir := backends(t, workflowYAML)
	js := jetStreamOf(t, nsrv)
	names := wfmeta.NamesForWorkflow("ns1", "wf", testWorkflowUID)
	node := newTestNode(t, "node-a")
	awaitOutcome := func(o *Options) { o.OutcomeWait = time.Minute }
	cons := node.pod(t, "consume-0", "consume", 0, cfgDir)
	result := cons.readAll("result.txt")

	failed := node.podMode(t, "produce-0", "produce", 0, cfgDir, v1alpha1.ModeFUSE, awaitOutcome)
	if err := os.WriteFile(filepath.Join(failed.app, "result.txt"), []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := wfmeta.RecordOutcome(ctx, js, names, "uid-produce-0", wfmeta.Outcome{Reason: "container main exited with code 1"}); err != nil {
		t.Fatal(err)
	}
	if err := failed.sc.Drain(); err != nil {
		t.Fatalf("draining the failed attempt's sidecar: %v", err)
	}
	md, err := wfmeta.Metadata(ctx, js, names)
	if err != nil {
		t.Fatal(err)
	}
	if len(md.Terminations) != 0 {
		t.Fatalf("terminations recorded after a failed attempt: %+v", md.Terminations)
	}

	retry := node.podMode(t, "produce-0-r1", "produce", 0, cfgDir, v1alpha1.ModeFUSE, awaitOutcome)
	want := []byte("the retry's result\n")
	if err := os.WriteFile(filepath.Join(retry.app, "result.txt"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-result:
		t.Fatalf("result.txt (OnTermination) was readable before a successful attempt terminated: %q", got)
	default:
	}
	if err := wfmeta.RecordOutcome(ctx, js, names, "uid-produce-0-r1", wfmeta.Outcome{Succeeded: true}); err != nil {
		t.Fatal(err)
	}
	if err := retry.sc.Drain(); err != nil {
		t.Fatalf("draining the retry's sidecar: %v", err)
	}
	if got := receive(t, "the consumer", result); !bytes.Equal(got, want) {
		t.Fatalf("the consumer read result.txt = %q, want the retry's %q", got, want)
	}

	// No controller answers: the consumer's sidecar records its termination after the wait.
	cons.sc.opts.OutcomeWait = 100 * time.Millisecond
	if err := cons.sc.Drain(); err != nil {
		t.Fatalf("draining the consumer's sidecar: %v", err)
	}
	if md, err = wfmeta.Metadata(ctx, js, names); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, term := range md.Terminations {
		got[term.Step+"/"+strconv.Itoa(term.Instance)] = true
	}
	if len(got) != 2 || !got["produce/0"] || !got["consume/0"] {
		t.Errorf("terminations recorded: %+v, want produce/0 (the retry) and consume/0 (no outcome in time)", md.Terminations)
	}
}

// waitFile polls a direct volume (which has no blocking opens) until name is there with
// want's bytes; it fails after 60 s.
func (p *testPod) waitFile(t *testing.T, name string, want []byte) {
	t.Helper()
	got, err := testenv.WaitFile(filepath.Join(p.app, name), want, 60*time.Second)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%s's direct volume shows %s as %d bytes (%v) after 60 s, want the %d committed", p.name, name, len(got), err, len(want))
	}
}

// Direct mode (no FUSE in the app's pod): a producer writes plain files in its
// directory; its sidecar ingests them, so a FUSE consumer on its node streams them from
// the node store and a direct consumer on another node finds them, committed, after
// they crossed NATS. The OnTermination output commits at the producer's drain and lands in
// object storage; nothing of it is visible in a consumer's directory before.
func TestDirectModePods(t *testing.T) {
	testenv.Root(t, "the CSI node plugin bind-mounts and mounts FUSE")
	ctx := context.Background()
	nsrv, mio, cfgDir := backends(t, workflowYAML)
	a, b := newTestNode(t, "node-a"), newTestNode(t, "node-b")
	prod := a.podMode(t, "produce-0", "produce", 0, cfgDir, v1alpha1.ModeDirect)
	near := a.pod(t, "consume-0", "consume", 0, cfgDir)
	far := b.podMode(t, "consume-1", "consume", 1, cfgDir, v1alpha1.ModeDirect)

	nearStream := near.readAll("stream.bin")
	stream := make([]byte, 3<<20+11)
	rand.Read(stream)
	if err := os.WriteFile(filepath.Join(prod.app, "stream.bin"), stream, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := receive(t, "FUSE consumer on the producer's node", nearStream); !bytes.Equal(got, stream) {
		t.Fatalf("the FUSE consumer read %d bytes (%.60q), want the %d written", len(got), got, len(stream))
	}
	far.waitFile(t, "stream.bin", stream)
	rec := httptest.NewRecorder()
	prod.sc.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if got, want := metric(rec.Body.String(), `sluice_volume_written_bytes_total{instance="0",node="node-a",step="produce",workflow="wf"}`), float64(len(stream)); got != want {
		t.Errorf("/metrics counts %v bytes written by the direct producer, want %v", got, want)
	}

	result := []byte("the direct producer's result\n")
	if err := os.WriteFile(filepath.Join(prod.app, "result.txt"), result, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(far.app, "result.txt")); !os.IsNotExist(err) {
		t.Fatalf("result.txt (OnTermination) is in the consumer's directory before the producer ended: %v", err)
	}
	if err := prod.sc.Drain(); err != nil {
		t.Fatalf("draining the producer's sidecar: %v", err)
	}
	far.waitFile(t, "result.txt", result)
	obj, err := mio.Object(ctx, "results", "wf/result.txt")
	if err != nil || !bytes.Equal(obj, result) {
		t.Fatalf("object storage holds %q (%v), want the committed result", obj, err)
	}
	for _, p := range []*testPod{near, far} {
		if err := p.sc.Drain(); err != nil {
			t.Errorf("draining %s: %v", p.name, err)
		}
	}
	// Each sidecar recorded its pod's counters for the Workflow's status: only the other
	// node received bytes.
	checkReceived(t, nsrv, map[string]int64{"produce-0": 0, "consume-0": 0, "consume-1": int64(len(stream) + len(result))})
}

// A Consumed file leaves the node store once its only consumer has read it to its end and
// closed it, while the consumer's pod still runs: the sidecars of a node delete what no
// declared reader needs.
func TestConsumedFileLeavesTheNodeStore(t *testing.T) {
	testenv.Root(t, "the CSI node plugin mounts FUSE")
	_, _, cfgDir := backends(t, `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: wf, namespace: ns1}
spec:
  steps:
  - name: produce
    outputs: [{path: tmp.bin, commit: {rule: OnClose}, lifetime: Consumed}]
  - name: consume
    inputs: [tmp.bin]
`)
	node := newTestNode(t, "node-a")
	prod := node.pod(t, "produce-0", "produce", 0, cfgDir)
	cons := node.pod(t, "consume-0", "consume", 0, cfgDir)
	// Observers run in order: this one after the sidecar's, which deletes the file.
	released := make(chan struct{}, 1)
	cons.sc.node.Engine.Observe(semantics.Observer{Release: func(semantics.FileStatus) { released <- struct{}{} }})
	read := cons.readAll("tmp.bin")
	want := bytes.Repeat([]byte("x"), 1<<20)
	if err := os.WriteFile(filepath.Join(prod.app, "tmp.bin"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := receive(t, "the consumer", read); !bytes.Equal(got, want) {
		t.Fatalf("the consumer read %d bytes, want %d", len(got), len(want))
	}
	if err := prod.sc.Drain(); err != nil {
		t.Fatal(err)
	}
	// The consumer read it to its end and closed it: it is released while the consumer's
	// pod still runs (the close reaches the sidecar as a FUSE RELEASE, after close(2)).
	stored := filepath.Join(cons.sc.node.Store.Dir(), "tmp.bin")
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatal("tmp.bin was not released 10 s after its only consumer read it to its end")
	}
	if _, err := os.Stat(stored); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("tmp.bin is still in the node store after its only consumer read it to its end (%v)", err)
	}
	if err := cons.sc.Drain(); err != nil {
		t.Fatal(err)
	}
	if f, b := cons.sc.releasedFiles.Load(), cons.sc.releasedBytes.Load(); f != 1 || b != 1<<20 {
		t.Errorf("the sidecar counts %d files, %d bytes released; want 1 and %d", f, b, 1<<20)
	}
}

const diskTierYAML = `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: wf, namespace: ns1}
spec:
  volume: {sizeLimit: 1Mi, disk: {sizeLimit: 64Mi}}
  tiers: {fs: [big.bin]}
  steps:
  - name: produce
    outputs: [{path: big.bin, commit: {rule: OnClose}}]
  - name: consume
    inputs: [big.bin]
`

// spillYAML is a workflow with a disk tier to spill to and no sizeLimit: on a cluster its
// memory tier is the size the CSI node plugin gives it.
const spillYAML = `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: wf, namespace: ns1}
spec:
  volume: {disk: {}}
  steps:
  - name: produce
    outputs: [{path: "part-*.bin", commit: {rule: OnClose}}]
  - name: consume
    inputs: ["part-*.bin"]
`

// The sidecar's node store waits and spills at the memory tier the CSI node plugin
// mounted for the workflow (its tmpfs, less what the plugin keeps), not at the kernel's
// ENOSPC: 8 MiB of committed files go through a 4 MiB tmpfs of a workflow without
// sizeLimit, the files that do not fit moved to the disk tier.
func TestSidecarSpillsBeforeTheKernelRefuses(t *testing.T) {
	testenv.Root(t, "the CSI node plugin mounts FUSE and tmpfs")
	_, _, cfgDir := backends(t, spillYAML)
	node := newTestNodeWith(t, "node-a", csidriver.Options{StoreSize: 64 << 20, WorkflowMemoryDefault: 4 << 20})
	prod := node.pod(t, "produce-0", "produce", 0, cfgDir)
	if lim := prod.sc.node.Store.Limit(); lim <= 0 || lim >= 4<<20 {
		t.Fatalf("the sidecar's memory tier is %d bytes; want the plugin's, below the 4 MiB tmpfs", lim)
	}
	part := make([]byte, 2<<20)
	for i := range 4 {
		rand.Read(part)
		if err := os.WriteFile(filepath.Join(prod.app, fmt.Sprintf("part-%d.bin", i)), part, 0o644); err != nil {
			t.Fatalf("writing part %d (%d MiB in all) through a 4 MiB tmpfs with a disk tier: %v", i, 2*(i+1), err)
		}
	}
	spilled, err := os.ReadDir(node.d.DiskDir("ns1", "wf"))
	if err != nil || len(spilled) == 0 {
		t.Errorf("nothing spilled to the disk tier (%v)", err)
	}
	if err := prod.sc.Drain(); err != nil {
		t.Errorf("draining: %v", err)
	}
}

// On a cluster, a file listed in spec.tiers.fs is kept in the workflow's disk tier, the
// CSI node plugin's directory on the node's disk, which the sidecar sees in its control
// volume: a file 8x the memory tier's sizeLimit streams between two pods of the node.
func TestDiskTierOnANode(t *testing.T) {
	testenv.Root(t, "the CSI node plugin mounts FUSE")
	_, _, cfgDir := backends(t, diskTierYAML)
	node := newTestNode(t, "node-a")
	prod := node.pod(t, "produce-0", "produce", 0, cfgDir)
	cons := node.pod(t, "consume-0", "consume", 0, cfgDir)
	got := cons.readAll("big.bin")
	data := make([]byte, 8<<20)
	rand.Read(data)
	if err := os.WriteFile(filepath.Join(prod.app, "big.bin"), data, 0o644); err != nil {
		t.Fatalf("writing 8 MiB through a 1 MiB memory tier with a disk tier: %v", err)
	}
	if b := receive(t, "the consumer", got); !bytes.Equal(b, data) {
		t.Fatalf("the consumer read %d bytes, want the %d written", len(b), len(data))
	}
	if st, err := os.Stat(filepath.Join(node.d.DiskDir("ns1", "wf"), "big.bin")); err != nil || st.Size() != int64(len(data)) {
		t.Errorf("big.bin in the node's disk tier: %v", err)
	}
	if _, err := os.Stat(filepath.Join(node.d.WorkflowDir("ns1", "wf"), "data", "big.bin")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("big.bin is in the memory tier too (%v)", err)
	}
	for _, p := range []*testPod{prod, cons} {
		if err := p.sc.Drain(); err != nil {
			t.Errorf("draining %s: %v", p.name, err)
		}
	}
}

// disablePoll does for the handed-over FUSE mount at target what go-fuse does for the
// mounts it makes itself: it polls go-fuse's poll-hack file there, the server answers POLL
// with ENOSYS, and the kernel never sends POLL on the connection again. Without it, the
// first epoll registration of a file on the volume sends FUSE POLL from inside
// epoll_ctl(2); Go's runtime registers every file it opens, with a raw system call that
// keeps its P, so a test process that serves the mount and opens files on it can have
// both its Ps blocked in the kernel while the goroutines that would answer never run.
// Production needs none of this: there the FUSE server is another process than the
// programs that open files (and the CSI plugin opens nothing in a pod's volume).
func disablePoll(target string) error {
	fd, err := unix.Open(filepath.Join(target, ".go-fuse-epoll-hack"), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening the poll hack file of FUSE mount %q: %w", target, err)
	}
	defer unix.Close(fd)
	_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLPRI | unix.POLLOUT}}, 0)
	return nil
}
