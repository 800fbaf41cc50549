package main

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/testutil"
)

// The controller's TLS flags: off, nothing is made; managed, the CA and certificate are
// issued into the Secret and its ca.crt returned; with another issuer, the controller
// waits for the Secret and returns its ca.crt; a NATS certificate directory without a
// Secret is refused at start.
func TestInstallationTLS(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log := testr.New(t)

	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	if ca, issuer, err := (&installationTLS{}).ensure(ctx, c, "sluice-system", log); err != nil || ca != nil || issuer != nil {
		t.Errorf("TLS off: CA %q, issuer %v, %v; want nothing", ca, issuer != nil, err)
	}
	if _, _, err := (&installationTLS{natsDir: "/etc/nats-tls"}).ensure(ctx, c, "sluice-system", log); err == nil || !strings.Contains(err.Error(), "--tls-secret") {
		t.Errorf("--nats-tls-dir without --tls-secret: %v", err)
	}

	managed := &installationTLS{secret: "sluice-tls", manage: true, services: []string{"sluice-nats", "sluice-minio"}}
	ca, issuer, err := managed.ensure(ctx, c, "sluice-system", log)
	if err != nil || issuer == nil {
		t.Fatalf("managed: issuer %v, %v", issuer != nil, err)
	}
	var sec corev1.Secret
	if err := c.Get(ctx, types.NamespacedName{Namespace: "sluice-system", Name: "sluice-tls"}, &sec); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ca, sec.Data[v1alpha1.SecretKeyCA]) || len(sec.Data[v1alpha1.SecretKeyCAKey]) == 0 || len(sec.Data[corev1.TLSCertKey]) == 0 {
		t.Errorf("managed: the Secret holds %d keys and the CA returned is not its ca.crt", len(sec.Data))
	}

	// Another issuer writes the Secret once the controller has looked for it and found
	// nothing: the controller waits for it.
	written := testutil.IssueServerTLS(t)
	var missed atomic.Bool
	external := fake.NewClientBuilder().WithScheme(scheme).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			err := c.Get(ctx, key, obj, opts...)
			if apierrors.IsNotFound(err) && !missed.Swap(true) {
				if cerr := c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "sluice-system", Name: "sluice-tls"},
					Type: corev1.SecretTypeTLS, Data: map[string][]byte{v1alpha1.SecretKeyCA: written.CA, corev1.TLSCertKey: []byte("cert"), corev1.TLSPrivateKeyKey: []byte("key")}}); cerr != nil {
					t.Error(cerr)
				}
			}
			return err
		},
	}).Build()
	ca, issuer, err = (&installationTLS{secret: "sluice-tls"}).ensure(ctx, external, "sluice-system", log)
	if !missed.Load() {
		t.Error("external issuer: the controller never found the Secret missing, so it did not wait")
	}
	if err != nil || issuer != nil || !bytes.Equal(ca, written.CA) {
		t.Errorf("external issuer: CA returned %v, issuer %v, %v; want the Secret's ca.crt and no issuer", bytes.Equal(ca, written.CA), issuer != nil, err)
	}
	var after corev1.Secret
	if err := external.Get(ctx, types.NamespacedName{Namespace: "sluice-system", Name: "sluice-tls"}, &after); err != nil || string(after.Data[corev1.TLSCertKey]) != "cert" {
		t.Errorf("the controller changed another issuer's Secret (%v)", err)
	}
}
