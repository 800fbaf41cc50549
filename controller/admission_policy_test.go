package controller

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	celgo "github.com/google/cel-go/cel"
	celtypes "github.com/google/cel-go/common/types"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/cel"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/inject"
)

// admissionPolicy reads the ValidatingAdmissionPolicy name from deploy/base/admission.yaml
// (the chart renders the same object: TestHelmChartMatchesKustomizeBase).
func admissionPolicy(t *testing.T, name string) *admissionregistrationv1.ValidatingAdmissionPolicy {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "deploy", "base", "admission.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			t.Fatalf("deploy/base/admission.yaml has no ValidatingAdmissionPolicy %s", name)
		}
		if err != nil {
			t.Fatal(err)
		}
		if obj["kind"] != "ValidatingAdmissionPolicy" {
			continue
		}
		js, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		var p admissionregistrationv1.ValidatingAdmissionPolicy
		if err := yaml.UnmarshalStrict(js, &p); err != nil {
			t.Fatal(err)
		}
		if p.Name == name {
			return &p
		}
	}
}

// expression is a CEL expression of a policy, of the type the API server requires of it.
type expression struct {
	name, expr string
	typ        *celgo.Type
}

// GetExpression implements cel.ExpressionAccessor.
func (e *expression) GetExpression() string { return e.expr }

// ReturnTypes implements cel.ExpressionAccessor.
func (e *expression) ReturnTypes() []*celgo.Type { return []*celgo.Type{e.typ} }

// GetName implements cel.NamedExpressionAccessor.
func (e *expression) GetName() string { return e.name }

// compiledPolicy is a ValidatingAdmissionPolicy compiled by the API server's own CEL
// environment and compiler, as kube-apiserver's ValidatingAdmissionPolicy plugin compiles
// it (the policies here use no parameters or audit annotations).
type compiledPolicy struct {
	policy                   *admissionregistrationv1.ValidatingAdmissionPolicy
	match, validations, msgs cel.ConditionEvaluator
}

func compilePolicy(t *testing.T, p *admissionregistrationv1.ValidatingAdmissionPolicy) *compiledPolicy {
	t.Helper()
	if p.Spec.ParamKind != nil || len(p.Spec.AuditAnnotations) > 0 {
		t.Fatalf("policy %s uses features this test does not compile", p.Name)
	}
	env, err := cel.NewCompositionEnv(cel.VariablesTypeName, environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	if err != nil {
		t.Fatal(err)
	}
	compiler := cel.NewCompositedCompilerFromTemplate(env)
	vars := make([]cel.NamedExpressionAccessor, len(p.Spec.Variables))
	for i, v := range p.Spec.Variables {
		vars[i] = &expression{name: v.Name, expr: v.Expression, typ: celgo.AnyType}
	}
	optional := cel.OptionalVariableDeclarations{HasAuthorizer: true}
	compiler.CompileAndStoreVariables(vars, optional, environment.StoredExpressions)
	conds := make([]cel.ExpressionAccessor, len(p.Spec.Validations))
	msgs := make([]cel.ExpressionAccessor, len(p.Spec.Validations))
	for i, v := range p.Spec.Validations {
		conds[i] = &expression{expr: v.Expression, typ: celgo.BoolType}
		msg := v.MessageExpression
		if msg == "" {
			msg = "''"
		}
		msgs[i] = &expression{expr: msg, typ: celgo.StringType}
	}
	match := make([]cel.ExpressionAccessor, len(p.Spec.MatchConditions))
	for i, m := range p.Spec.MatchConditions {
		match[i] = &expression{expr: m.Expression, typ: celgo.BoolType}
	}
	c := &compiledPolicy{policy: p,
		match:       compiler.CompileCondition(match, optional, environment.StoredExpressions),
		validations: compiler.CompileCondition(conds, optional, environment.StoredExpressions),
		msgs:        compiler.CompileCondition(msgs, cel.OptionalVariableDeclarations{}, environment.StoredExpressions)}
	for _, errs := range [][]error{c.match.CompilationErrors(), c.validations.CompilationErrors(), c.msgs.CompilationErrors()} {
		if len(errs) > 0 {
			t.Fatalf("policy %s does not compile: %v", p.Name, errs)
		}
	}
	return c
}

// The users the policy tests' requests come from: a tenant's pod and the controller.
const (
	tenantUser     = "system:serviceaccount:tenant-a:default"
	controllerUser = "system:serviceaccount:sluice-system:sluice-controller"
)

// podRequest is pod's admission by user: CREATE of the pod, or, with subresource
// "ephemeralcontainers", the UPDATE that adds its ephemeral containers.
type podRequest struct {
	user        string
	subresource string
	pod         *corev1.Pod
}

func (r podRequest) validate(t *testing.T, p *compiledPolicy) []string {
	t.Helper()
	if r.subresource != "" {
		return apiRequest{user: r.user, op: admission.Update, resource: "pods", subresource: r.subresource, obj: r.pod, old: r.pod}.validate(t, p)
	}
	return apiRequest{user: r.user, op: admission.Create, resource: "pods", obj: r.pod}.validate(t, p)
}

// apiRequest is an admission request by user: op on obj (CREATE, UPDATE) or old (UPDATE,
// DELETE), an object of resource (core/v1 pods and secrets, admissionregistration/v1
// webhook configurations).
type apiRequest struct {
	user                  string
	op                    admission.Operation
	resource, subresource string
	obj, old              metav1.Object
}

// validate runs p on r and returns the denial messages; an expression that fails to
// evaluate fails the test (with failurePolicy Fail it would refuse every such request in
// the cluster).
func (r apiRequest) validate(t *testing.T, p *compiledPolicy) []string {
	t.Helper()
	var obj, old runtime.Object
	meta := r.obj
	if r.obj != nil {
		obj = r.obj.(runtime.Object)
	}
	if r.old != nil {
		old, meta = r.old.(runtime.Object), r.old
	}
	gvk := map[string]schema.GroupVersionKind{"pods": corev1.SchemeGroupVersion.WithKind("Pod"), "secrets": corev1.SchemeGroupVersion.WithKind("Secret"),
		"mutatingwebhookconfigurations":   admissionregistrationv1.SchemeGroupVersion.WithKind("MutatingWebhookConfiguration"),
		"validatingwebhookconfigurations": admissionregistrationv1.SchemeGroupVersion.WithKind("ValidatingWebhookConfiguration"),
	}[r.resource]
	gvr := gvk.GroupVersion().WithResource(r.resource)
	attr := admission.NewAttributesRecord(obj, old, gvk, meta.GetNamespace(), meta.GetName(), gvr, r.subresource, r.op, nil, false, &user.DefaultInfo{Name: r.user})
	versioned := &admission.VersionedAttributes{Attributes: attr, VersionedObject: obj, VersionedOldObject: old, VersionedKind: gvk}
	resource := r.resource
	if r.subresource != "" {
		resource += "/" + r.subresource
	}
	request := cel.CreateAdmissionRequest(attr, metav1.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: resource}, metav1.GroupVersionKind(gvk))
	ns := cel.CreateNamespaceObject(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: meta.GetNamespace()}})
	matches, _, err := p.match.ForInput(context.Background(), versioned, request, cel.OptionalVariableBindings{}, ns, celconfig.RuntimeCELCostBudget)
	if err != nil {
		t.Fatalf("evaluating the match conditions of policy %s: %v", p.policy.Name, err)
	}
	for i, m := range matches {
		if m.Error != nil {
			t.Fatalf("match condition %d of policy %s failed to evaluate: %v", i, p.policy.Name, m.Error)
		}
		if m.EvalResult != celtypes.True {
			return nil // the policy does not apply
		}
	}
	results, budget, err := p.validations.ForInput(context.Background(), versioned, request, cel.OptionalVariableBindings{}, ns, celconfig.RuntimeCELCostBudget)
	if err != nil {
		t.Fatalf("evaluating policy %s: %v", p.policy.Name, err)
	}
	msgs, _, err := p.msgs.ForInput(context.Background(), versioned, request, cel.OptionalVariableBindings{}, ns, budget)
	if err != nil {
		t.Fatalf("evaluating the messages of policy %s: %v", p.policy.Name, err)
	}
	var denied []string
	for i, res := range results {
		if res.Error != nil {
			t.Fatalf("validation %d of policy %s failed to evaluate: %v", i, p.policy.Name, res.Error)
		}
		if res.EvalResult == celtypes.True {
			continue
		}
		msg := strings.TrimSpace(p.policy.Spec.Validations[i].Message)
		if m := msgs[i]; m.Error == nil && m.EvalResult != nil {
			if s, ok := m.EvalResult.Value().(string); ok && s != "" {
				msg = s
			}
		} else if m.Error != nil {
			t.Fatalf("the message of validation %d of policy %s failed to evaluate: %v", i, p.policy.Name, m.Error)
		}
		denied = append(denied, msg)
	}
	return denied
}

// The admission policy sluice-pods closes the CSI node plugin to pods Sluice did not make
// (issue 32, finding 4): a tenant's pod declaring a csi.sluice.io volume with attributes
// of its choice, or presenting the webhook's mark (sluice.io/injected, which the webhook refuses
// to see preset) without going through the webhook, and app, init or ephemeral containers mounting the sidecar's credentials or
// control volume, are refused, and so are a Sluice pod that shares its process namespace
// and an ephemeral container that targets the sidecar (issue 43, finding 5); the pods
// the webhook injects and those the controller creates are admitted, as is every pod
// that has nothing of Sluice.
func TestAdmissionPolicyRefusesPodsSluiceDidNotMake(t *testing.T) {
	v := compilePolicy(t, admissionPolicy(t, "sluice-pods"))
	const tenant, controller = tenantUser, controllerUser
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Name: "wf", Namespace: "tenant-a"},
		Spec: v1alpha1.WorkflowSpec{Steps: []v1alpha1.Step{{Name: "s"}}}}
	app := func() *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "tenant-a"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}
	}
	// injected is app as the webhook (labelled, marked) or the controller leaves it.
	injected := func(webhook bool) *corev1.Pod {
		p := app()
		if webhook {
			p.Labels = map[string]string{v1alpha1.LabelInject: "true"}
		}
		if err := inject.Pod(p, wf, inject.Instance{Step: "s"}, inject.Options{Image: "sluice"}); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// ownUser is p with its sidecar running as its workflow's user of the agent range
	// (status.agentUser), as inject makes it.
	ownUser := func(p *corev1.Pod) *corev1.Pod {
		for i := range p.Spec.InitContainers {
			if p.Spec.InitContainers[i].Name == inject.SidecarName {
				p.Spec.InitContainers[i].SecurityContext.RunAsUser = ptr.To[int64](2100000003)
				p.Spec.InitContainers[i].SecurityContext.RunAsGroup = ptr.To[int64](2100000003)
			}
		}
		return p
	}
	csiVolume := func(name, role string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: v1alpha1.DriverName,
			VolumeAttributes: map[string]string{v1alpha1.VolumeAttrWorkflow: "no-such-workflow", v1alpha1.VolumeAttrRole: role}}}}
	}
	with := func(p *corev1.Pod, f func(*corev1.Pod)) *corev1.Pod { f(p); return p }

	for _, c := range []struct {
		name   string
		req    podRequest
		refuse string // a part of the message; empty: admitted
	}{
		{"a pod with nothing of Sluice", podRequest{user: tenant, pod: app()}, ""},
		{"a pod the webhook injected", podRequest{user: "system:serviceaccount:kube-system:job-controller", pod: injected(true)}, ""},
		{"a pod the controller created", podRequest{user: controller, pod: injected(false)}, ""},
		{"a tenant's own csi.sluice.io volume", podRequest{user: tenant, pod: with(app(), func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, csiVolume("evil", v1alpha1.RoleSidecar))
		})}, "are added by Sluice, not declared by pods (found evil)"},
		{"a tenant's pod made to look injected, without the webhook", podRequest{user: tenant, pod: injected(false)},
			"only for pods the Sluice webhook admitted"},
		{"a labelled pod without the webhook's mark", podRequest{user: tenant, pod: with(injected(false), func(p *corev1.Pod) {
			p.Labels[v1alpha1.LabelInject] = "true"
			delete(p.Annotations, v1alpha1.AnnotationInjected)
		})}, "only for pods the Sluice webhook admitted"},
		{"an extra csi.sluice.io volume in a Workflow's template", podRequest{user: controller, pod: with(injected(false), func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, csiVolume("extra", v1alpha1.RoleSidecar))
		})}, "(found extra)"},
		{"an app container mounting the sidecar's configuration", podRequest{user: "system:serviceaccount:kube-system:job-controller", pod: with(injected(true), func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: inject.ConfigVolume, MountPath: "/creds"})
		})}, "only the Sluice sidecar mounts"},
		{"an init container mounting the sidecar's control volume", podRequest{user: controller, pod: with(injected(false), func(p *corev1.Pod) {
			p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: "init", Image: "busybox",
				VolumeMounts: []corev1.VolumeMount{{Name: inject.ControlVolume, MountPath: "/sluice"}}})
		})}, "only the Sluice sidecar mounts"},
		{"an ephemeral container (kubectl debug) mounting the control volume", podRequest{user: tenant, subresource: "ephemeralcontainers",
			pod: with(injected(true), func(p *corev1.Pod) {
				p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
					Name: "debug", Image: "busybox", VolumeMounts: []corev1.VolumeMount{{Name: inject.ControlVolume, MountPath: "/sluice"}}}})
			})}, "only the Sluice sidecar mounts"},
		{"an injected pod sharing its process namespace", podRequest{user: controller, pod: with(injected(false), func(p *corev1.Pod) {
			p.Spec.ShareProcessNamespace = boolPtr(true)
		})}, "spec.shareProcessNamespace"},
		{"a pod of nothing of Sluice sharing its process namespace", podRequest{user: tenant, pod: with(app(), func(p *corev1.Pod) {
			p.Spec.ShareProcessNamespace = boolPtr(true)
		})}, ""},
		{"an ephemeral container targeting the sidecar (kubectl debug --target)", podRequest{user: tenant, subresource: "ephemeralcontainers",
			pod: with(injected(true), func(p *corev1.Pod) {
				p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{TargetContainerName: inject.SidecarName,
					EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: "busybox"}})
			})}, "no ephemeral container targets the Sluice sidecar"},
		{"an ephemeral container targeting the app", podRequest{user: tenant, subresource: "ephemeralcontainers",
			pod: with(injected(true), func(p *corev1.Pod) {
				p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{TargetContainerName: "app",
					EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: "busybox"}})
			})}, ""},
		{"an ephemeral container without Sluice's volumes", podRequest{user: tenant, subresource: "ephemeralcontainers",
			pod: with(injected(false), func(p *corev1.Pod) {
				p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
					Name: "debug", Image: "busybox"}})
			})}, ""},
		// The agent range (--agent-users): a workflow's user is its sidecars' alone.
		{"the sidecar of a workflow with a user of its own, injected", podRequest{user: "system:serviceaccount:kube-system:job-controller", pod: ownUser(injected(true))}, ""},
		{"the sidecar of a workflow with a user of its own, the controller's", podRequest{user: controller, pod: ownUser(injected(false))}, ""},
		{"a tenant's container running as a workflow's user", podRequest{user: tenant, pod: with(app(), func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](2100000003)}
		})}, "are Sluice's, one for each workflow's sidecars"},
		{"a tenant's pod-wide user in the range", podRequest{user: tenant, pod: with(app(), func(p *corev1.Pod) {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](2100065535)}
		})}, "are Sluice's"},
		{"an app container of an injected pod running as its workflow's user", podRequest{user: controller, pod: with(ownUser(injected(false)), func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](2100000003)}
		})}, "are Sluice's"},
		{"a tenant's own container named like the sidecar, as a workflow's user", podRequest{user: tenant, pod: with(app(), func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: inject.SidecarName, Image: "busybox",
				SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](2100000003)}}}
		})}, "are Sluice's"},
		{"an ephemeral container running as the workflow's user", podRequest{user: tenant, subresource: "ephemeralcontainers",
			pod: with(ownUser(injected(true)), func(p *corev1.Pod) {
				p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{EphemeralContainerCommon: corev1.EphemeralContainerCommon{
					Name: "debug", Image: "busybox", SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](2100000003)}}})
			})}, "are Sluice's"},
		{"a tenant's pod-wide fsGroup in the range", podRequest{user: tenant, pod: with(app(), func(p *corev1.Pod) {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: ptr.To[int64](2100000003)}
		})}, "are Sluice's"},
		{"a tenant's supplemental group in the range", podRequest{user: tenant, pod: with(app(), func(p *corev1.Pod) {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{SupplementalGroups: []int64{5, 2100000003}}
		})}, "are Sluice's"},
		{"a tenant's container with a group of the range", podRequest{user: tenant, pod: with(app(), func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsGroup: ptr.To[int64](2100000000)}
		})}, "are Sluice's"},
		{"a user just outside the range", podRequest{user: tenant, pod: with(app(), func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To[int64](2100065536)}
		})}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			denied := c.req.validate(t, v)
			switch {
			case c.refuse == "" && len(denied) > 0:
				t.Errorf("refused: %q", denied)
			case c.refuse != "" && len(denied) == 0:
				t.Errorf("admitted; want refused with %q", c.refuse)
			case c.refuse != "" && !strings.Contains(strings.Join(denied, "\n"), c.refuse):
				t.Errorf("refused with %q; want a message with %q", denied, c.refuse)
			}
		})
	}
}

// checkDecisions runs each case's request through p and compares the refusals with
// what the case wants: nothing (admitted) or a message holding refuse.
func checkDecisions(t *testing.T, p *compiledPolicy, cases map[string]struct {
	req    apiRequest
	refuse string
}) {
	t.Helper()
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			denied := c.req.validate(t, p)
			switch {
			case c.refuse == "" && len(denied) > 0:
				t.Errorf("refused: %q", denied)
			case c.refuse != "" && len(denied) == 0:
				t.Errorf("admitted; want refused with %q", c.refuse)
			case c.refuse != "" && !strings.Contains(strings.Join(denied, "\n"), c.refuse):
				t.Errorf("refused with %q; want a message with %q", denied, c.refuse)
			}
		})
	}
}

// The admission policy sluice-controller narrows what the controller's service account may
// do beyond what RBAC can say (issue 32, finding 9): create and delete only pods a
// Workflow controls, and write Secrets outside its namespace only when they are its own
// before and after the write. Other users are not its concern.
func TestAdmissionPolicyNarrowsTheController(t *testing.T) {
	p := compilePolicy(t, admissionPolicy(t, "sluice-controller"))
	const controller = "system:serviceaccount:sluice-system:sluice-controller"
	owned := func(m *metav1.ObjectMeta) {
		m.OwnerReferences = []metav1.OwnerReference{{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Workflow", Name: "wf",
			UID: "u", Controller: boolPtr(true)}}
	}
	pod := func(own bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "tenant-a"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}
		if own {
			owned(&p.ObjectMeta)
		}
		return p
	}
	secret := func(ns string, own, managed bool) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sluice-wf", Namespace: ns}}
		if own {
			owned(&s.ObjectMeta)
		}
		if managed {
			s.Labels = map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedBy}
		}
		return s
	}
	checkDecisions(t, p, map[string]struct {
		req    apiRequest
		refuse string
	}{
		"a step pod":           {apiRequest{user: controller, op: admission.Create, resource: "pods", obj: pod(true)}, ""},
		"deleting a step pod":  {apiRequest{user: controller, op: admission.Delete, resource: "pods", old: pod(true)}, ""},
		"any other pod":        {apiRequest{user: controller, op: admission.Create, resource: "pods", obj: pod(false)}, "only pods that a Workflow controls"},
		"deleting another pod": {apiRequest{user: controller, op: admission.Delete, resource: "pods", old: pod(false)}, "only pods that a Workflow controls"},
		"another user's pod":   {apiRequest{user: "alice", op: admission.Create, resource: "pods", obj: pod(false)}, ""},
		"a workflow's Secret":  {apiRequest{user: controller, op: admission.Create, resource: "secrets", obj: secret("tenant-a", true, true)}, ""},
		"updating a workflow's Secret": {apiRequest{user: controller, op: admission.Update, resource: "secrets",
			obj: secret("tenant-a", true, true), old: secret("tenant-a", true, true)}, ""},
		"a Secret of its own namespace": {apiRequest{user: controller, op: admission.Create, resource: "secrets", obj: secret("sluice-system", false, false)}, ""},
		"a tenant's Secret, relabelled and taken over": {apiRequest{user: controller, op: admission.Update, resource: "secrets",
			obj: secret("tenant-a", true, true), old: secret("tenant-a", false, false)}, "writes only its own Secrets"},
		"an unlabelled Secret in a tenant's namespace": {apiRequest{user: controller, op: admission.Create, resource: "secrets",
			obj: secret("tenant-a", true, false)}, "writes only its own Secrets"},
	})
}

func boolPtr(v bool) *bool { return &v }

// The policy's agent range is the controller's (--agent-users in deploy/base): a range
// changed in one place only would leave the IDs outside the policy's open to any pod.
func TestAdmissionPolicyGuardsTheControllersAgentUsers(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "deploy", "base", "controller.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`--agent-users=(\d+)-(\d+)`).FindSubmatch(raw)
	if m == nil {
		t.Fatal("deploy/base/controller.yaml sets no --agent-users")
	}
	policy, err := os.ReadFile(filepath.Join("..", "deploy", "base", "admission.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{" < " + string(m[1]) + " || ", " > " + string(m[2]) + ")", string(m[1]) + "-" + string(m[2]) + " are Sluice's"} {
		if !strings.Contains(string(policy), want) {
			t.Errorf("deploy/base/admission.yaml has no %q: its range is not the controller's %s-%s", want, m[1], m[2])
		}
	}
}
