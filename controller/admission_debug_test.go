package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/controller/inject"
)

// Against a real kube-apiserver with deploy/base's policy sluice-pods: `kubectl debug
// --target=sluice-sidecar` (an ephemeral container targeting the sidecar, added through
// the pods/ephemeralcontainers subresource) is refused; one targeting the app is added.
func TestAPIServerRefusesDebuggingTheSidecar(t *testing.T) {
	const ns = "debug-sidecar"
	var admin client.Client
	var debug func(name, target string) error
	admin = withPolicy(t, "sluice-pods", ns, func(context.Context) error { return debug("debug", inject.SidecarName) })
	ctx := context.Background()
	always := corev1.ContainerRestartPolicyAlways
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: inject.SidecarName, Image: "sluice", RestartPolicy: &always}},
			Containers:     []corev1.Container{{Name: "app", Image: "busybox"}}}}
	if err := admin.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	debug = func(name, target string) error {
		q := p.DeepCopy()
		if err := admin.Get(ctx, client.ObjectKeyFromObject(p), q); err != nil {
			return err
		}
		q.Spec.EphemeralContainers = append(q.Spec.EphemeralContainers, corev1.EphemeralContainer{TargetContainerName: target,
			EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: name, Image: "busybox"}})
		return admin.SubResource("ephemeralcontainers").Update(ctx, q, client.DryRunAll)
	}
	const refused = "no ephemeral container targets the Sluice sidecar"
	eventually(t, 30*time.Second, "debugging the sidecar refused", func() error {
		err := debug("debug", inject.SidecarName)
		if err == nil {
			return errors.New("an ephemeral container targeting the sidecar was added")
		}
		if !strings.Contains(err.Error(), refused) {
			return fmt.Errorf("refused, but not by the policy: %w", err)
		}
		return nil
	})
	if err := debug("debug-app", "app"); err != nil {
		t.Errorf("an ephemeral container targeting the app: %v", err)
	}
}
