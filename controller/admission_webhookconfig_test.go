package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/controller/certs"
)

// sluiceWebhookConfig reads the MutatingWebhookConfiguration of deploy/base/webhook.yaml
// with a caBundle, as the controller keeps it.
func sluiceWebhookConfig(t *testing.T) *admissionregistrationv1.MutatingWebhookConfiguration {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "deploy", "base", "webhook.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg admissionregistrationv1.MutatingWebhookConfiguration
	if err := yaml.UnmarshalStrict(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	for i := range cfg.Webhooks {
		cfg.Webhooks[i].ClientConfig.CABundle = []byte("old CA")
	}
	return &cfg
}

// The admission policy sluice-webhook-config lets the controller's service account
// change only the caBundle of Sluice's MutatingWebhookConfiguration (issue 43, finding
// 5): a stolen controller token, which RBAC lets update and patch that object, cannot
// turn the webhook off or send pods elsewhere. Other users are not its concern.
func TestAdmissionPolicyLetsTheControllerChangeOnlyTheCABundle(t *testing.T) {
	p := compilePolicy(t, admissionPolicy(t, "sluice-webhook-config"))
	const controller = controllerUser
	update := func(f func(*admissionregistrationv1.MutatingWebhookConfiguration)) apiRequest {
		old := sluiceWebhookConfig(t)
		obj := old.DeepCopy()
		f(obj)
		return apiRequest{user: controller, op: admission.Update, resource: "mutatingwebhookconfigurations", obj: obj, old: old}
	}
	hook := func(f func(*admissionregistrationv1.MutatingWebhook)) func(*admissionregistrationv1.MutatingWebhookConfiguration) {
		return func(c *admissionregistrationv1.MutatingWebhookConfiguration) { f(&c.Webhooks[0]) }
	}
	const onlyCABundle = "changes only the caBundle"
	all := &metav1.LabelSelector{}
	checkDecisions(t, p, map[string]struct {
		req    apiRequest
		refuse string
	}{
		"a new caBundle": {update(hook(func(w *admissionregistrationv1.MutatingWebhook) {
			w.ClientConfig.CABundle = []byte("new CA")
		})), ""},
		"nothing changed": {update(func(*admissionregistrationv1.MutatingWebhookConfiguration) {}), ""},
		"another user turning the webhook off": {func() apiRequest {
			r := update(hook(func(w *admissionregistrationv1.MutatingWebhook) {
				w.FailurePolicy = ptr.To(admissionregistrationv1.Ignore)
			}))
			r.user = "cluster-admin"
			return r
		}(), ""},
		"failurePolicy Ignore": {update(hook(func(w *admissionregistrationv1.MutatingWebhook) {
			w.FailurePolicy = ptr.To(admissionregistrationv1.Ignore)
		})), onlyCABundle},
		"no rules": {update(hook(func(w *admissionregistrationv1.MutatingWebhook) { w.Rules = nil })), onlyCABundle},
		"an objectSelector that matches nothing": {update(hook(func(w *admissionregistrationv1.MutatingWebhook) {
			w.ObjectSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"never": "set"}}
		})), onlyCABundle},
		"a namespaceSelector": {update(hook(func(w *admissionregistrationv1.MutatingWebhook) {
			w.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "none"}}
		})), onlyCABundle},
		"pods sent to another service": {update(hook(func(w *admissionregistrationv1.MutatingWebhook) {
			w.ClientConfig.Service.Namespace = "tenant-a"
		})), onlyCABundle},
		"pods sent to a URL": {update(hook(func(w *admissionregistrationv1.MutatingWebhook) {
			w.ClientConfig.Service, w.ClientConfig.URL = nil, ptr.To("https://evil.example/inject")
		})), onlyCABundle},
		"a match condition that matches nothing": {update(hook(func(w *admissionregistrationv1.MutatingWebhook) {
			w.MatchConditions = []admissionregistrationv1.MatchCondition{{Name: "never", Expression: "false"}}
		})), onlyCABundle},
		"a renamed webhook": {update(hook(func(w *admissionregistrationv1.MutatingWebhook) { w.Name = "other.sluice.io" })), onlyCABundle},
		"a second webhook": {update(func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
			extra := c.Webhooks[0]
			extra.Name, extra.ObjectSelector = "extra.sluice.io", all
			c.Webhooks = append(c.Webhooks, extra)
		}), onlyCABundle},
		"no webhooks": {update(func(c *admissionregistrationv1.MutatingWebhookConfiguration) { c.Webhooks = nil }), onlyCABundle},
		"another CA injector (cert-manager's annotation)": {update(func(c *admissionregistrationv1.MutatingWebhookConfiguration) {
			c.Annotations = map[string]string{"cert-manager.io/inject-ca-from": "tenant-a/evil"}
		}), "no label, annotation, owner or finalizer"},
		"another webhook configuration": {func() apiRequest {
			r := update(func(*admissionregistrationv1.MutatingWebhookConfiguration) {})
			r.obj.(*admissionregistrationv1.MutatingWebhookConfiguration).Name = "other"
			r.old.(*admissionregistrationv1.MutatingWebhookConfiguration).Name = "other"
			return r
		}(), "updates only the MutatingWebhookConfiguration sluice"},
		"creating a webhook configuration": {apiRequest{user: controller, op: admission.Create, resource: "mutatingwebhookconfigurations",
			obj: func() metav1.Object { c := sluiceWebhookConfig(t); c.Name = "evil"; return c }()}, "updates only the MutatingWebhookConfiguration sluice"},
		"deleting Sluice's": {apiRequest{user: controller, op: admission.Delete, resource: "mutatingwebhookconfigurations",
			old: sluiceWebhookConfig(t)}, "updates only the MutatingWebhookConfiguration sluice"},
		"a validating webhook configuration": {apiRequest{user: controller, op: admission.Create, resource: "validatingwebhookconfigurations",
			obj: &admissionregistrationv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "sluice"}}},
			"updates only the MutatingWebhookConfiguration sluice"},
	})
}

// The policy sluice-webhook-config compares every field of a webhook but caBundle by
// name: a field Kubernetes adds to MutatingWebhook (or to its clientConfig) would go
// unchecked, so this fails until the policy names it.
func TestWebhookConfigPolicyNamesEveryField(t *testing.T) {
	p := admissionPolicy(t, "sluice-webhook-config")
	var exprs []string
	for _, v := range p.Spec.Validations {
		exprs = append(exprs, v.Expression)
	}
	all := strings.Join(exprs, "\n")
	fields := func(v any) []string {
		var names []string
		ty := reflect.TypeOf(v)
		for i := range ty.NumField() {
			names = append(names, strings.Split(ty.Field(i).Tag.Get("json"), ",")[0])
		}
		return names
	}
	for _, f := range fields(admissionregistrationv1.MutatingWebhook{}) {
		if f != "name" && f != "clientConfig" && !strings.Contains(all, "w.?"+f+" == o.?"+f) {
			t.Errorf("the policy does not compare the webhooks' field %s", f)
		}
	}
	for _, f := range fields(admissionregistrationv1.WebhookClientConfig{}) {
		if f != "caBundle" && !strings.Contains(all, "w.clientConfig.?"+f+" == o.clientConfig.?"+f) {
			t.Errorf("the policy does not compare the webhooks' field clientConfig.%s", f)
		}
	}
}

// Against a real kube-apiserver, with deploy/base's ClusterRole for the controller and
// the policy sluice-webhook-config: the controller's token patches the caBundle of
// Sluice's webhook configuration (certs.PatchCABundle, as the controller does) but cannot
// turn the webhook off, which its RBAC alone allows (issue 43, finding 5: a stolen
// controller token could patch the MutatingWebhookConfiguration). It shows too that the
// API server applies ValidatingAdmissionPolicies to webhook configurations.
func TestControllerTokenCannotTurnTheWebhookOff(t *testing.T) {
	te := clusterOf(t)
	admin := startClient(t, te)
	ctx := context.Background()
	t.Cleanup(func() { restoreCABundle(t, admin, te) })
	installFromDeployBase(t, admin, "ClusterRole//sluice-controller", "ClusterRoleBinding//sluice-controller",
		"ValidatingAdmissionPolicy//sluice-webhook-config", "ValidatingAdmissionPolicyBinding//sluice-webhook-config")
	cfg := controllerConfig(te)
	controller, err := client.New(cfg, client.Options{Scheme: te.Scheme})
	if err != nil {
		t.Fatal(err)
	}

	// Turning the webhook off (a dry run: admission runs, nothing is stored) is refused
	// once the API server has the policy.
	off := client.RawPatch(types.JSONPatchType, []byte(`[{"op":"replace","path":"/webhooks/0/failurePolicy","value":"Ignore"}]`))
	turnOff := func() error {
		return controller.Patch(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "sluice"}}, off, client.DryRunAll)
	}
	eventually(t, 30*time.Second, "the controller's token refused turning the webhook off", func() error {
		err := turnOff()
		if err == nil {
			return errors.New("the controller's token set failurePolicy Ignore")
		}
		if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "changes only the caBundle") {
			return fmt.Errorf("refused, but not by the policy: %w", err)
		}
		return nil
	})
	// The caBundle, as the controller keeps it, is still its to change.
	c := &certs.Certs{Client: controller, WebhookConfig: "sluice", Log: testr.New(t)}
	if err := c.PatchCABundle(ctx, []byte("-----BEGIN CERTIFICATE-----\nnew\n-----END CERTIFICATE-----\n")); err != nil {
		t.Fatalf("the controller could not patch its caBundle: %v", err)
	}
	// And deleting the configuration is refused (RBAC grants no delete).
	if err := controller.Delete(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "sluice"}}, client.DryRunAll); err == nil {
		t.Error("the controller's token deleted the webhook configuration")
	}
}

// installFromDeployBase creates the objects keys (kind/namespace/name) of deploy/base's
// rbac.yaml and admission.yaml with the administrator's client, and deletes them when t
// ends.
func installFromDeployBase(t *testing.T, admin client.Client, keys ...string) {
	t.Helper()
	manifests := map[string]map[string]any{}
	for _, f := range []string{"rbac.yaml", "admission.yaml"} {
		raw, err := os.ReadFile(filepath.Join("..", "deploy", "base", f))
		if err != nil {
			t.Fatal(err)
		}
		maps.Copy(manifests, objects(t, f, raw))
	}
	for _, key := range keys {
		obj, ok := manifests[key]
		if !ok {
			t.Fatalf("deploy/base has no %s", key)
		}
		u := &unstructured.Unstructured{Object: obj}
		if err := admin.Create(context.Background(), u); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating %s: %v", key, err)
		}
		t.Cleanup(func() { _ = admin.Delete(context.Background(), u) })
	}
}

// withPolicy installs deploy/base's ValidatingAdmissionPolicy policy and its binding in
// the package's envtest, creates namespace ns, and returns the administrator's client.
// When t ends it deletes them and waits until offend, a dry run of a request the policy
// refuses, is admitted again: the API server drops a deleted policy a moment later, and
// the package's next test must not meet it.
func withPolicy(t *testing.T, policy, ns string, offend func(context.Context) error) client.Client {
	t.Helper()
	admin := startClient(t, clusterOf(t))
	namespace := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	if err := admin.Create(context.Background(), namespace); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Delete(context.Background(), namespace) })
	t.Cleanup(func() { // after the policy's deletion (cleanups run last first)
		eventually(t, 30*time.Second, "policy "+policy+" gone", func() error { return offend(context.Background()) })
	})
	installFromDeployBase(t, admin, "ValidatingAdmissionPolicy//"+policy, "ValidatingAdmissionPolicyBinding//"+policy)
	return admin
}

// controllerConfig is te's configuration impersonating the controller's service account
// (sluice-system/sluice-controller), so that its requests have deploy/base's RBAC.
func controllerConfig(te *envtest.Environment) *rest.Config {
	cfg := rest.CopyConfig(te.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:sluice-system:sluice-controller",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:sluice-system", "system:authenticated"}}
	return cfg
}
