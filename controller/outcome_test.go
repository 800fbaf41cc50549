package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-io/sluice/internal/wfmeta"
)

func terminated(code int32) corev1.ContainerState {
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: "Completed"}}
}

// An outcome is final only when no app container will run again; the native sidecar
// (an init container) does not count.
func TestAppOutcome(t *testing.T) {
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	pod := func(policy corev1.RestartPolicy, phase corev1.PodPhase, states ...corev1.ContainerState) *corev1.Pod {
		p := &corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: policy}, Status: corev1.PodStatus{Phase: phase}}
		for i, s := range states {
			name := fmt.Sprintf("c%d", i)
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: name})
			p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: name, State: s})
		}
		p.Spec.InitContainers = []corev1.Container{{Name: "sluice-sidecar"}}
		return p
	}
	for _, tc := range []struct {
		name      string
		pod       *corev1.Pod
		final, ok bool
		reason    string
	}{
		{"one still running", pod(corev1.RestartPolicyNever, corev1.PodRunning, terminated(0), running), false, false, ""},
		{"all exited 0", pod(corev1.RestartPolicyNever, corev1.PodRunning, terminated(0), terminated(0)), true, true, ""},
		{"one failed, never restarted", pod(corev1.RestartPolicyNever, corev1.PodRunning, terminated(0), terminated(3)), true, false, "container c1 exited with code 3"},
		{"failed under OnFailure: it runs again", pod(corev1.RestartPolicyOnFailure, corev1.PodRunning, terminated(3)), false, false, ""},
		{"succeeded under OnFailure", pod(corev1.RestartPolicyOnFailure, corev1.PodRunning, terminated(0)), true, true, ""},
		{"evicted", func() *corev1.Pod {
			p := pod(corev1.RestartPolicyOnFailure, corev1.PodFailed, running)
			p.Status.Reason = "Evicted"
			return p
		}(), true, false, "Evicted"},
		{"no status yet", &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}}}, false, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, final := appOutcome(tc.pod)
			if final != tc.final {
				t.Fatalf("final = %v, want %v (outcome %+v)", final, tc.final, o)
			}
			if !final {
				return
			}
			if o.Succeeded != tc.ok || !strings.Contains(o.Reason, tc.reason) {
				t.Errorf("outcome %+v, want succeeded %v and a reason holding %q", o, tc.ok, tc.reason)
			}
		})
	}
}

// The controller records each pod's outcome in the workflow's KV bucket once its app
// containers have ended, while the sidecar still runs (phase Running): a failed attempt
// as failed, naming the container, and its retry's success as success.
func TestOutcomesAreRecordedForSidecars(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()
	ns := e.namespace(t, "outcome")
	wf := workflowFrom(t, ns, `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: out}
spec:
  steps:
  - name: a
    backoffLimit: 1
    template: {spec: {containers: [{name: main, image: busybox}]}}
    outputs: [{path: x, commit: {rule: OnTermination}}]
`)
	if err := e.k8s.Create(ctx, wf); err != nil {
		t.Fatal(err)
	}
	names := wfmeta.NamesForWorkflow(ns, wf.Name, string(wf.UID))
	outcome := func(podUID string) (wfmeta.Outcome, error) {
		var o wfmeta.Outcome
		kv, err := e.js.KeyValue(ctx, names.Bucket)
		if err != nil {
			return o, err
		}
		en, err := kv.Get(ctx, wfmeta.OutcomeKey(podUID))
		if err != nil {
			return o, err
		}
		return o, json.Unmarshal(en.Value(), &o)
	}

	first := e.waitPod(t, ns, "out-a-0")
	if _, err := outcome(string(first.UID)); err == nil {
		t.Fatal("an outcome was recorded for a pod whose containers had not run")
	}
	e.exitApp(t, first, 2)
	eventually(t, 20*time.Second, "the failed attempt's outcome", func() error {
		o, err := outcome(string(first.UID))
		if err != nil {
			return err
		}
		if o.Succeeded || !strings.Contains(o.Reason, "container main exited with code 2") {
			return fmt.Errorf("outcome %+v", o)
		}
		return nil
	})

	// The kubelet fails the pod once the sidecar has exited; the controller retries.
	e.finish(t, first, corev1.PodFailed, 2)
	retried := e.waitPod(t, ns, "out-a-0-r1")
	e.exitApp(t, retried, 0)
	eventually(t, 20*time.Second, "the retry's outcome", func() error {
		o, err := outcome(string(retried.UID))
		if err != nil {
			return err
		}
		if !o.Succeeded {
			return fmt.Errorf("outcome %+v", o)
		}
		return nil
	})
}

// exitApp records that a pod's app container exited with code exit while its sidecar
// runs on, as the kubelet does before it sends the sidecar SIGTERM.
func (e *env) exitApp(t *testing.T, p *corev1.Pod, exit int32) {
	t.Helper()
	e.setPodStatus(t, p, "recording the exit", func(st *corev1.PodStatus) {
		st.Phase = corev1.PodRunning
		st.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", State: terminated(exit)}}
	})
}
