package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/admission"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/inject"
)

// The admission policy sluice-workflow-label keeps the label the NetworkPolicies allow
// NATS and MinIO by (sluice.io/workflow) Sluice's (issue 43, finding 5): a tenant's pod
// that sets it, on creation or by an update, with any value, is refused, and so is an
// injected pod relabelled to another workflow; the pods the webhook injects and those
// the controller creates keep it, and updates that leave it alone are admitted.
func TestAdmissionPolicyKeepsTheNetworkAllowLabelSluices(t *testing.T) {
	p := compilePolicy(t, admissionPolicy(t, "sluice-workflow-label"))
	const tenant, controller = tenantUser, controllerUser
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Name: "wf", Namespace: "tenant-a"},
		Spec: v1alpha1.WorkflowSpec{Steps: []v1alpha1.Step{{Name: "s"}}}}
	app := func(labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "tenant-a", Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}
	}
	injected := func() *corev1.Pod {
		p := app(map[string]string{v1alpha1.LabelInject: "true"})
		if err := inject.Pod(p, wf, inject.Instance{Step: "s"}, inject.Options{Image: "sluice"}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	relabelled := func(p *corev1.Pod, key, value string) *corev1.Pod {
		p = p.DeepCopy()
		if value == "" {
			delete(p.Labels, key)
		} else {
			p.Labels[key] = value
		}
		return p
	}
	create := func(user string, p *corev1.Pod) apiRequest {
		return apiRequest{user: user, op: admission.Create, resource: "pods", obj: p}
	}
	update := func(old, p *corev1.Pod) apiRequest {
		return apiRequest{user: tenant, op: admission.Update, resource: "pods", obj: p, old: old}
	}
	const refused = "sluice.io/workflow is set by Sluice on the pods it injects"
	checkDecisions(t, p, map[string]struct {
		req    apiRequest
		refuse string
	}{
		"a pod with nothing of Sluice": {create(tenant, app(nil)), ""},
		"a pod the webhook injected":   {create("system:serviceaccount:kube-system:job-controller", injected()), ""},
		"a pod the controller created": {create(controller, injected()), ""},
		"a tenant's pod labelled sluice.io/workflow": {create(tenant, app(map[string]string{v1alpha1.LabelWorkflow: "wf"})),
			refused + " for that workflow, never on a pod it did not inject (it lets a pod reach NATS and the object store); label the pod sluice.io/inject=true too, so that the webhook injects it into workflow wf"},
		"a pod that asked by labels to join, injected": {create("system:serviceaccount:kube-system:job-controller", func() *corev1.Pod {
			p := app(map[string]string{v1alpha1.LabelInject: "true", v1alpha1.LabelWorkflow: "wf", v1alpha1.LabelStep: "s"})
			if err := inject.Pod(p, wf, inject.Instance{Step: "s"}, inject.Options{Image: "sluice"}); err != nil {
				t.Fatal(err)
			}
			return p
		}()), ""},
		"a tenant's pod labelled with an empty workflow": {create(tenant, app(map[string]string{v1alpha1.LabelWorkflow: ""})), refused},
		"a tenant's pod with a csi.sluice.io volume of another name": {create(tenant, func() *corev1.Pod {
			p := injected()
			for i := range p.Spec.Volumes {
				if p.Spec.Volumes[i].Name == inject.ControlVolume {
					p.Spec.Volumes[i].Name = "not-the-control-volume"
				}
			}
			return p
		}()), refused},
		"the label added to a running pod":               {update(app(nil), app(map[string]string{v1alpha1.LabelWorkflow: "wf"})), refused},
		"an injected pod relabelled to another workflow": {update(injected(), relabelled(injected(), v1alpha1.LabelWorkflow, "other")), refused},
		"an injected pod given another label":            {update(injected(), relabelled(injected(), "team", "a")), ""},
		"the label removed":                              {update(injected(), relabelled(injected(), v1alpha1.LabelWorkflow, "")), ""},
	})
}

// The NetworkPolicies that open NATS and MinIO to other namespaces do so only for pods
// that the admission policy sluice-workflow-label refuses to a tenant (issue 43, finding
// 5: the allow-label was one any pod could set): for each such peer, a tenant's pod
// made to match its podSelector is refused.
func TestNetworkPoliciesAllowOnlyPodsSluiceMade(t *testing.T) {
	p := compilePolicy(t, admissionPolicy(t, "sluice-workflow-label"))
	raw, err := os.ReadFile(filepath.Join("..", "deploy", "base", "networkpolicy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for key, obj := range objects(t, "deploy/base/networkpolicy.yaml", raw) {
		var np networkingv1.NetworkPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj, &np); err != nil {
			t.Fatal(err)
		}
		component := np.Spec.PodSelector.MatchLabels["app.kubernetes.io/component"]
		if component != "nats" && component != "minio" {
			continue
		}
		for _, rule := range np.Spec.Ingress {
			if len(rule.From) == 0 {
				t.Errorf("%s: an ingress rule from anywhere", key)
			}
			for _, peer := range rule.From {
				if peer.NamespaceSelector == nil {
					continue // sluice-system's own pods
				}
				if peer.PodSelector == nil || len(peer.PodSelector.MatchLabels)+len(peer.PodSelector.MatchExpressions) == 0 {
					t.Errorf("%s: every pod of the namespaces %v may connect", key, peer.NamespaceSelector)
					continue
				}
				labels := map[string]string{}
				for k, v := range peer.PodSelector.MatchLabels {
					labels[k] = v
				}
				for _, e := range peer.PodSelector.MatchExpressions {
					switch {
					case e.Operator == metav1.LabelSelectorOpExists:
						labels[e.Key] = "anything"
					case e.Operator == metav1.LabelSelectorOpIn && len(e.Values) > 0:
						labels[e.Key] = e.Values[0]
					}
				}
				pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "tenant-a", Labels: labels},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}
				if denied := (apiRequest{user: tenantUser, op: admission.Create, resource: "pods", obj: pod}).validate(t, p); len(denied) == 0 {
					t.Errorf("%s: a tenant may create a pod with labels %v, which this policy lets connect", key, labels)
				}
				checked++
			}
		}
	}
	if checked == 0 {
		t.Fatal("no NetworkPolicy of deploy/base opens NATS or MinIO to workflow pods")
	}
}

// Against a real kube-apiserver with deploy/base's policy sluice-workflow-label: a
// tenant's pod labelled sluice.io/workflow is refused at creation, and the label cannot be
// added to a running pod either; the same pod without it is admitted.
func TestAPIServerRefusesTheAllowLabelToATenantsPod(t *testing.T) {
	const ns = "allow-label"
	pod := func(labels map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns, Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}
	}
	var admin client.Client
	// A dry run: admission runs, nothing is stored.
	labelled := func(ctx context.Context) error {
		p := pod(map[string]string{v1alpha1.LabelWorkflow: "wf"})
		p.Name = "labelled"
		return admin.Create(ctx, p, client.DryRunAll)
	}
	admin = withPolicy(t, "sluice-workflow-label", ns, labelled)
	ctx := context.Background()
	const refused = "sluice.io/workflow is set by Sluice"
	eventually(t, 30*time.Second, "the labelled pod refused", func() error {
		err := labelled(ctx)
		if err == nil {
			return errors.New("a tenant's pod labelled sluice.io/workflow was admitted")
		}
		if !strings.Contains(err.Error(), refused) {
			return fmt.Errorf("refused, but not by the policy: %w", err)
		}
		return nil
	})
	p := pod(map[string]string{"team": "a"})
	if err := admin.Create(ctx, p); err != nil {
		t.Fatalf("a pod without the label: %v", err)
	}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"sluice.io/workflow":"wf"}}}`))
	if err := admin.Patch(ctx, p, patch); err == nil || !strings.Contains(err.Error(), refused) {
		t.Errorf("adding sluice.io/workflow to a running pod: %v; want refused by the policy", err)
	}
}
