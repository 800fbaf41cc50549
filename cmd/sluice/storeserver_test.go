package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	csidriver "github.com/sluice-io/sluice/csi-driver"
	"github.com/sluice-io/sluice/internal/natsauth"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/published"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/storeserver"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/internal/testutil"
	"github.com/sluice-io/sluice/internal/transport"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// TestMain makes this test binary sluice itself when it is run as a store server child
// (`/proc/self/exe csi store-server`, as the CSI plugin starts it) or as a sidecar
// (TestSidecarIsNotDumpable).
func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "csi" && os.Args[2] == storeServerUse ||
		len(os.Args) > 1 && os.Args[1] == "sidecar" && os.Getenv(sidecarTestEnv) == "1" {
		main()
	}
	os.Exit(m.Run())
}

// The CSI plugin's store server runs in a child process that holds no privilege (issue
// 32: "a node's store is served by a process that holds no root"): the sidecars' user and
// group, no supplementary group, no capability in any set, no_new_privs, and no
// credential on its command line or in its environment. It still serves a committed
// file to another node, and when it is killed the plugin starts it again.
func TestStoreServerProcessHoldsNoRoot(t *testing.T) {
	testenv.Root(t, "starts the store server as another user")
	if err := storeserver.CheckIsolation(); err != nil {
		// What the plugin names at start (NewChildren) where it cannot isolate them.
		t.Skipf("store servers cannot be isolated here: %v", err)
	}
	url := testutil.NATS(t)
	// The workflow's own user (status.agentUser), not the plugin's default 65532: the
	// server runs as its workflow's sidecars do.
	const agentUser = 2100000007
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "wf", UID: "0f1e2d3c-4b5a"},
		Status: v1alpha1.WorkflowStatus{AgentUser: ptr.To[int64](agentUser)}}
	if err := yaml.UnmarshalStrict([]byte(`
steps:
- name: p
  outputs: [{path: "*", commit: {rule: OnClose}}]
- name: c
  inputs: ["*"]`), &wf.Spec); err != nil {
		t.Fatal(err)
	}
	// The plugin's state directory, laid out as the plugin lays it out.
	state := t.TempDir()
	d, err := csidriver.New(csidriver.Options{NodeID: "node-a", StateDir: state, SidecarUID: 65532, SidecarGID: 65532,
		DiskTier: csidriver.DiskTierDirectory})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	nodeA := d.WorkflowDir(wf.Namespace, wf.Name)
	// The pod that ran on node-a wrote f and g, then ended.
	names := wfmeta.NamesForWorkflow(wf.Namespace, wf.Name, string(wf.UID))
	prod, st := testutil.Peer(t, &wf.Spec, filepath.Join(nodeA, "data"), store.Options{}, transport.Config{
		Conn: testutil.Connect(t, url), Names: names, Node: "p-0", Host: "node-a", StateDir: filepath.Join(nodeA, "state")})
	files := map[string][]byte{"f": make([]byte, 1<<20+3), "g": make([]byte, 1<<20+5)}
	for name, data := range files {
		rand.Read(data)
		if err := prod.Create(name, false); err != nil {
			t.Fatal(err)
		}
		sp, _ := st.Path(name)
		if err := os.WriteFile(sp, data, 0o644); err != nil {
			t.Fatal(err)
		}
		prod.Write(name, 0, int64(len(data)))
		prod.Wrote(name, 0, data)
		prod.Close(name)
	}
	if err := prod.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	prod.Stop()
	// The sidecars run as the workflow's user: what they made in the workflow's directory
	// is theirs.
	for _, dir := range []string{nodeA, d.DiskDirOf(nodeA)} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
			if err != nil || p == dir {
				return err
			}
			return os.Lchown(p, agentUser, agentUser)
		}); err != nil {
			t.Fatal(err)
		}
	}

	// The plugin published the workflow here; its agent Secret holds the workflow's NATS
	// credentials.
	keys, err := natsauth.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	creds, err := keys.Creds("wf", natsauth.WorkflowPermissions(names))
	if err != nil {
		t.Fatal(err)
	}
	if err := published.Record(d.RecordDirOf(nodeA), string(wf.UID)); err != nil {
		t.Fatal(err)
	}

	started := make(chan int, 4)
	children, err := storeServerChildren(csidriver.Options{StateDir: state, SidecarUID: 65532, SidecarGID: 65532}, testr.New(t), "", func(_ string, pid int) { started <- pid })
	if err != nil {
		t.Fatal(err)
	}
	servers := storeserver.New(storeserver.Options{
		Node: "node-a", Log: testr.New(t), DiskOf: d.DiskDirOf, RecordOf: d.RecordDirOf,
		Workflow: func(_ context.Context, ns, name string) (*v1alpha1.Workflow, error) {
			if ns == wf.Namespace && name == wf.Name {
				return wf.DeepCopy(), nil
			}
			return nil, nil
		},
		Connection: func(context.Context, *v1alpha1.Workflow) (*podconfig.Connection, error) {
			return &podconfig.Connection{URL: url, Creds: creds}, nil
		},
		Start: children.Start,
	})
	t.Cleanup(servers.StopAll)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := servers.Ensure(ctx, nodeA); err != nil {
		t.Fatal(err)
	}
	var pid int
	select {
	case pid = <-started:
	default:
		t.Fatal("the store server serves, but in no process of its own")
	}

	status := procStatus(t, pid)
	for key, want := range map[string]string{
		"Uid": "2100000007\t2100000007\t2100000007\t2100000007", "Gid": "2100000007\t2100000007\t2100000007\t2100000007", "Groups": "",
		"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
		"CapBnd": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1",
	} {
		if got, ok := status[key]; !ok || got != want {
			t.Errorf("store server process %d: %s %q, want %q", pid, key, got, want)
		}
	}
	assertIsolated(t, pid, state)
	token, seed := credsParts(t, creds)
	for _, f := range []string{"cmdline", "environ"} {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), f))
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(seed)) || bytes.Contains(b, []byte(token)) || bytes.Contains(b, []byte(base64.StdEncoding.EncodeToString(creds))) {
			t.Errorf("/proc/%d/%s shows the workflow's NATS credentials: %q", pid, f, b)
		}
	}

	// A reader on node-b fetches f from the store server.
	reader, rst := testutil.Peer(t, &wf.Spec, filepath.Join(t.TempDir(), "data"), store.Options{}, transport.Config{
		Conn: testutil.Connect(t, url), Names: names, Node: "c-0", Host: "node-b", FetchTimeout: 10 * time.Second})
	t.Cleanup(reader.Stop)
	fetch := func(name string) {
		t.Helper()
		data := files[name]
		if _, eof, err := reader.WaitRead(ctx, name, 0, int64(len(data))); err != nil || !eof {
			t.Fatalf("%s not complete on node-b: %v", name, err)
		}
		if err := reader.Fetch(ctx, name, 0, int64(len(data))); err != nil {
			t.Fatalf("fetching %s from the store server process: %v", name, err)
		}
		rp, _ := rst.Path(name)
		if got, err := os.ReadFile(rp); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("node-b's copy of %s: %d bytes (%v), want the %d written", name, len(got), err, len(data))
		}
	}
	fetch("f")

	// Killed, the store server process is started again, and serves.
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case again := <-started:
		if again == pid {
			t.Fatalf("the restarted store server has the killed one's pid %d", pid)
		}
		pid = again
	case <-ctx.Done():
		t.Fatal("the killed store server process was not started again")
	}
	fetch("g")
	assertIsolated(t, pid, state)

	// Stopped with the workflow's store, it ends.
	servers.Stop(nodeA)
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("store server process %d after Stop: %v, want it gone", pid, err)
	}
}

// assertIsolated checks that store server process pid sees only its own workflow's
// directories (and the system's certificate roots, where this machine has them): its root (as the kernel resolves it for the process) holds wf, disk, proc
// and the resolver files, the workflow's data/ and state/ are under /wf, ".." of /wf is
// that root, and nothing of the plugin's state directory is there; and that it is not
// dumpable, so no other process of its user reaches its descriptors (/proc/<pid>/fd is
// root's).
func assertIsolated(t *testing.T, pid int, state string) {
	t.Helper()
	root := filepath.Join("/proc", strconv.Itoa(pid), "root")
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	for _, n := range names {
		if n != "wf" && n != "disk" && n != "proc" && n != "etc" {
			t.Errorf("the store server process %d sees %s in its root %v; want only wf, disk, proc and etc", pid, n, names)
		}
	}
	if _, err := os.Stat("/etc/ssl/certs"); err == nil {
		if _, err := os.Stat(filepath.Join(root, "etc/ssl/certs")); err != nil {
			t.Errorf("the store server process %d has no system certificate roots: %v", pid, err)
		}
	}
	for _, p := range []string{"wf/data", "wf/state", "disk"} {
		if st, err := os.Stat(filepath.Join(root, p)); err != nil || !st.IsDir() {
			t.Errorf("the store server process %d has no directory /%s: %v", pid, p, err)
		}
	}
	up, err := os.ReadDir(filepath.Join(root, "wf", ".."))
	if err != nil || len(up) != len(entries) {
		t.Errorf("/wf/.. of the store server process %d: %d entries (%v), want its root's %d", pid, len(up), err, len(entries))
	}
	if _, err := os.Stat(filepath.Join(root, state)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the store server process %d reaches the plugin's state directory %s: %v", pid, state, err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join("/proc", strconv.Itoa(pid), "fd"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 0 {
		t.Errorf("/proc/%d/fd belongs to uid %d: the store server process is dumpable, other processes of its user reach its descriptors", pid, st.Uid)
	}
	// Not dumpable from its execve on, before it could make itself so: its executable is
	// one its user may not read.
	if err := syscall.Stat(filepath.Join("/proc", strconv.Itoa(pid), "exe"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 0 || st.Mode&0o777 != 0o711 {
		t.Errorf("the store server process %d runs an executable of uid %d, mode %o; want root's, 0711 (unreadable to its user)", pid, st.Uid, st.Mode&0o777)
	}
}

// procStatus returns the fields of /proc/<pid>/status.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// credsParts returns the JWT and the seed of a NATS credentials file.
func credsParts(t *testing.T, creds []byte) (token, seed string) {
	t.Helper()
	for _, line := range strings.Split(string(creds), "\n") {
		switch {
		case strings.HasPrefix(line, "eyJ"):
			token = line
		case strings.HasPrefix(line, "SU"):
			seed = line
		}
	}
	if token == "" || seed == "" {
		t.Fatalf("no JWT or seed in the credentials:\n%s", creds)
	}
	return token, seed
}
