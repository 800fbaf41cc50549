package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/servers"
	"github.com/sluice-io/sluice/internal/testenv"
)

// A failed Workflow keeps in object storage only what rests on nothing that failed, as
// `sluice run` keeps --out: the result of a consumer of a failed producer (a fallback it
// wrote for the input that never came) is removed once no pod runs, and listed in
// status.removedOutputs with the lineage, with a Warning Event; the output of a step that
// read nothing that failed stays, and status.outputs lists only it.
func TestFailedWorkflowRemovesOutputsThatRestOnTheFailure(t *testing.T) {
	testenv.Integration(t, "MinIO (hack/servers.sh)")
	m, err := servers.StartMinIO(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	ctx := context.Background()
	if _, err := m.Bucket(ctx, "results"); err != nil {
		t.Fatal(err)
	}
	e := startEnv(t)
	ns := e.namespace(t, "derived")
	if err := e.k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s3", Namespace: ns},
		Data: map[string][]byte{"accessKey": []byte(m.AccessKey), "secretKey": []byte(m.SecretKey)}}); err != nil {
		t.Fatal(err)
	}
	wf := workflowFrom(t, ns, `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: lineage}
spec:
  permanent: [r.txt, keep.txt]
  storage: {bucket: results, endpoint: "http://`+m.Endpoint+`", secretRef: {name: s3}}
  steps:
  - name: p
    outputs: [{path: in.txt, commit: {rule: OnClose}}]
  - name: c
    inputs: [in.txt]
    outputs: [{path: r.txt, commit: {rule: OnClose}}]
  - name: k
    outputs: [{path: keep.txt, commit: {rule: OnClose}}]
`)
	if err := e.k8s.Create(ctx, wf); err != nil {
		t.Fatal(err)
	}
	var sec corev1.Secret
	eventually(t, 20*time.Second, "the configuration Secret", func() error {
		return e.k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: podconfig.SecretName("lineage")}, &sec)
	})
	st := storageOf(t, &sec)
	c, err := minio.New(m.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(m.AccessKey, m.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"r.txt", "keep.txt"} {
		if _, err := c.PutObject(ctx, "results", st.Prefix+name, strings.NewReader("x\n"), 2, minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
		e.recordCommit(t, ns, "lineage", name, "s3://results/"+st.Prefix+name)
	}
	// c and k finish first; then p fails (with no retries left).
	e.labelledPod(t, ns, "lineage", "c", corev1.PodSucceeded)
	e.labelledPod(t, ns, "lineage", "k", corev1.PodSucceeded)
	eventually(t, 20*time.Second, "c and k succeeded", func() error {
		got, err := e.workflow(ns, "lineage")
		if err != nil {
			return err
		}
		if got.Status.Progress != "2/3" {
			return fmt.Errorf("progress %q", got.Status.Progress)
		}
		return nil
	})
	e.labelledPod(t, ns, "lineage", "p", corev1.PodFailed)
	eventually(t, 30*time.Second, "r.txt removed and listed", func() error {
		got, err := e.workflow(ns, "lineage")
		if err != nil {
			return err
		}
		if got.Status.Phase != v1alpha1.WorkflowFailed {
			return fmt.Errorf("phase %s", got.Status.Phase)
		}
		if len(got.Status.RemovedOutputs) != 1 || got.Status.RemovedOutputs[0].Path != "r.txt" ||
			!strings.Contains(got.Status.RemovedOutputs[0].Reason, "made by step c: step c reads what step p makes; step p did not succeed") {
			return fmt.Errorf("removedOutputs %+v", got.Status.RemovedOutputs)
		}
		if len(got.Status.Outputs) != 1 || got.Status.Outputs[0].Path != "keep.txt" {
			return fmt.Errorf("outputs %+v, want keep.txt alone", got.Status.Outputs)
		}
		return nil
	})
	if _, err := c.StatObject(ctx, "results", st.Prefix+"r.txt", minio.StatObjectOptions{}); err == nil {
		t.Error("r.txt is still in the bucket")
	}
	if _, err := c.StatObject(ctx, "results", st.Prefix+"keep.txt", minio.StatObjectOptions{}); err != nil {
		t.Errorf("keep.txt, made by a step that read nothing that failed, was removed: %v", err)
	}
	eventually(t, 20*time.Second, "a RemovedOutputs Event", func() error {
		if ev := e.events(ns, ReasonRemovedOutputs); len(ev) != 1 || !strings.Contains(ev[0], "r.txt (made by step c") {
			return fmt.Errorf("events %q", ev)
		}
		return nil
	})
}
