package certs

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"net"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// The bundled servers' certificate covers every Service named (in each of the names a
// pod may use) and the loopback address, and a renewal keeps the CA, which the clients
// hold, while the CA outlives the new certificate; only then is the CA replaced.
func TestServerCertificateForServicesKeepsItsCA(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	now := time.Now()
	issuer := &Certs{Client: c, Namespace: "sluice-system", SecretName: "sluice-tls", Name: "sluice-tls",
		Services: []string{"sluice-nats", "sluice-minio"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		Validity: 30 * 24 * time.Hour, Log: logr.Discard(), Now: func() time.Time { return now }}
	stored := func() map[string][]byte {
		t.Helper()
		var sec corev1.Secret
		if err := c.Get(ctx, types.NamespacedName{Namespace: "sluice-system", Name: "sluice-tls"}, &sec); err != nil {
			t.Fatal(err)
		}
		return sec.Data
	}
	renew, err := issuer.Ensure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first := stored()
	block, _ := pem.Decode(first[corev1.TLSCertKey])
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(first[v1alpha1.SecretKeyCA])
	for _, host := range []string{"sluice-nats", "sluice-nats.sluice-system", "sluice-nats.sluice-system.svc", "sluice-nats.sluice-system.svc.cluster.local",
		"sluice-minio.sluice-system.svc", "127.0.0.1"} {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: pool, CurrentTime: now}); err != nil {
			t.Errorf("the certificate does not verify for %s: %v", host, err)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "sluice-webhook.sluice-system.svc", Roots: pool, CurrentTime: now}); err == nil {
		t.Error("the certificate verifies for a Service it was not issued for")
	}

	// Renewal: a new certificate signed by the same CA.
	now = renew.Add(time.Minute)
	if _, err := issuer.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	second := stored()
	if string(second[corev1.TLSCertKey]) == string(first[corev1.TLSCertKey]) {
		t.Fatal("the certificate was not renewed")
	}
	if string(second[v1alpha1.SecretKeyCA]) != string(first[v1alpha1.SecretKeyCA]) || string(second[v1alpha1.SecretKeyCAKey]) != string(first[v1alpha1.SecretKeyCAKey]) {
		t.Error("a renewal replaced the CA although it outlives the new certificate: clients holding it would refuse the servers")
	}

	// Near the CA's end: a new CA.
	now = now.Add((caLifetimes - 1) * 30 * 24 * time.Hour)
	if _, err := issuer.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if third := stored(); string(third[v1alpha1.SecretKeyCA]) == string(first[v1alpha1.SecretKeyCA]) {
		t.Error("a CA that expires before the new certificate was kept")
	}
}
