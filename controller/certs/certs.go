// Package certs keeps the pod injection webhook's serving certificate without
// cert-manager: a self-signed CA and a certificate for the webhook Service, stored in a
// Secret, written for the webhook server, patched into the MutatingWebhookConfiguration's
// caBundle, and renewed before it expires (Certs). With cert-manager
// (deploy/overlays/cert-manager) the controller leaves the certificate to it.
package certs

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// defaultValidty is how long a certificate the controller makes is valid.
const defaultValidty = 365 * 24 * time.Hour

// Certs manages the webhook's serving certificate without cert-manager: a self-signed CA
// and a serving certificate for the webhook Service, kept in a Secret (so every replica
// and restart serves the same), written to CertDir for the webhook server (which reloads
// changed files), and the CA patched into the MutatingWebhookConfiguration's caBundle. The
// certificate is renewed when a third of its validity remains.
type Certs struct {
	// Client reads and writes the Secret and the webhook configuration (uncached).
	Client client.Client
	// Namespace and SecretName locate the Secret; Service is the webhook Service's name
	// (in Namespace); WebhookConfig is the MutatingWebhookConfiguration's name.
	Namespace, SecretName, Service, WebhookConfig string
	// CertDir receives tls.crt and tls.key.
	CertDir string
	// Validity of a new certificate (default one year).
	Validity time.Duration
	// Log receives renewals.
	Log logr.Logger
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time

	kickOnce sync.Once
	kicks    chan struct{}
}

func (c *Certs) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// Ensure makes the Secret hold a valid certificate (creating or renewing it), writes it
// to CertDir and patches the caBundle. It returns when the certificate must be renewed.
func (c *Certs) Ensure(ctx context.Context) (time.Time, error) {
	var sec corev1.Secret
	key := types.NamespacedName{Namespace: c.Namespace, Name: c.SecretName}
	err := c.Client.Get(ctx, key, &sec)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return time.Time{}, fmt.Errorf("reading webhook certificate Secret %s: %w", key, err)
	}
	renewAt, valid := c.check(sec.Data)
	if !valid {
		data, err := c.issue()
		if err != nil {
			return time.Time{}, err
		}
		sec.Data = data
		if exists {
			err = c.Client.Update(ctx, &sec)
		} else {
			sec.ObjectMeta = metav1.ObjectMeta{Name: c.SecretName, Namespace: c.Namespace, Labels: map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedBy}}
			sec.Type = corev1.SecretTypeTLS
			err = c.Client.Create(ctx, &sec)
		}
		if err != nil {
			return time.Time{}, fmt.Errorf("storing the webhook certificate in Secret %s: %w", key, err)
		}
		renewAt, _ = c.check(sec.Data)
		c.Log.Info("issued webhook serving certificate", "secret", key.String(), "renewAt", renewAt)
	}
	if err := c.writeFiles(sec.Data); err != nil {
		return time.Time{}, err
	}
	if err := c.PatchCABundle(ctx, sec.Data[v1alpha1.SecretKeyCA]); err != nil {
		return time.Time{}, err
	}
	return renewAt, nil
}

// check reports when the stored certificate must be renewed and whether it is usable
// now (present, matching its key, for the Service, signed by the stored CA).
func (c *Certs) check(data map[string][]byte) (time.Time, bool) {
	pair, err := tls.X509KeyPair(data[corev1.TLSCertKey], data[corev1.TLSPrivateKeyKey])
	if err != nil || len(data[v1alpha1.SecretKeyCA]) == 0 || len(data[v1alpha1.SecretKeyCAKey]) == 0 {
		return time.Time{}, false
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return time.Time{}, false
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data[v1alpha1.SecretKeyCA]) {
		return time.Time{}, false
	}
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: c.dnsNames()[2], Roots: pool, CurrentTime: c.now()}); err != nil {
		return time.Time{}, false
	}
	renewAt := leaf.NotAfter.Add(-leaf.NotAfter.Sub(leaf.NotBefore) / 3)
	return renewAt, c.now().Before(renewAt)
}

func (c *Certs) dnsNames() []string {
	s, ns := c.Service, c.Namespace
	return []string{s, s + "." + ns, s + "." + ns + ".svc", s + "." + ns + ".svc.cluster.local"}
}

// issue creates a new CA and serving certificate (ECDSA P-256).
func (c *Certs) issue() (map[string][]byte, error) {
	validity := c.Validity
	if validity <= 0 {
		validity = defaultValidty
	}
	now := c.now().Add(-time.Minute)
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating the webhook CA key: %w", err)
	}
	serial := func() *big.Int {
		n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
		return n
	}
	caTmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "sluice-webhook-ca"},
		NotBefore: now, NotAfter: now.Add(validity), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("signing the webhook CA: %w", err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating the webhook key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: c.dnsNames()[2]}, DNSNames: c.dnsNames(),
		NotBefore: now, NotAfter: now.Add(validity),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("signing the webhook certificate: %w", err)
	}
	pemKey := func(k *ecdsa.PrivateKey) ([]byte, error) {
		b, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return nil, err
		}
		return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: b}), nil
	}
	caKeyPEM, err := pemKey(caKey)
	if err != nil {
		return nil, err
	}
	keyPEM, err := pemKey(key)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		v1alpha1.SecretKeyCA:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		v1alpha1.SecretKeyCAKey: caKeyPEM,
		corev1.TLSCertKey:       pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		corev1.TLSPrivateKeyKey: keyPEM,
	}, nil
}

// writeFiles writes tls.crt and tls.key into CertDir atomically (rename), only when
// they changed.
func (c *Certs) writeFiles(data map[string][]byte) error {
	if c.CertDir == "" {
		return nil
	}
	if err := os.MkdirAll(c.CertDir, 0o700); err != nil {
		return fmt.Errorf("webhook certificate directory: %w", err)
	}
	for _, k := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey} {
		p := filepath.Join(c.CertDir, k)
		if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, data[k]) {
			continue
		}
		tmp := p + ".tmp"
		if err := os.WriteFile(tmp, data[k], 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", p, err)
		}
		if err := os.Rename(tmp, p); err != nil {
			return fmt.Errorf("writing %s: %w", p, err)
		}
	}
	return nil
}

// PatchCABundle sets caBundle on every webhook of the MutatingWebhookConfiguration that
// does not hold it already.
func (c *Certs) PatchCABundle(ctx context.Context, ca []byte) error {
	var cfg admissionregistrationv1.MutatingWebhookConfiguration
	if err := c.Client.Get(ctx, types.NamespacedName{Name: c.WebhookConfig}, &cfg); err != nil {
		return fmt.Errorf("reading MutatingWebhookConfiguration %s: %w", c.WebhookConfig, err)
	}
	patch := client.MergeFrom(cfg.DeepCopy())
	changed := false
	for i := range cfg.Webhooks {
		if !bytes.Equal(cfg.Webhooks[i].ClientConfig.CABundle, ca) {
			cfg.Webhooks[i].ClientConfig.CABundle = ca
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if err := c.Client.Patch(ctx, &cfg, patch); err != nil {
		return fmt.Errorf("patching the caBundle of MutatingWebhookConfiguration %s: %w", c.WebhookConfig, err)
	}
	c.Log.Info("patched webhook caBundle", "webhookConfiguration", c.WebhookConfig)
	return nil
}

// Start keeps the certificate valid until ctx ends (a manager.Runnable): it renews it
// when due, and puts the caBundle back when the webhook configuration is re-applied
// (the reconciler registered by SetupWithManager triggers Ensure through kick).
func (c *Certs) Start(ctx context.Context) error {
	for {
		renewAt, err := c.Ensure(ctx)
		wait := time.Until(renewAt)
		if err != nil {
			c.Log.Error(err, "webhook certificate")
			wait = 30 * time.Second
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		case <-c.kick():
		}
	}
}

func (c *Certs) kick() chan struct{} {
	c.kickOnce.Do(func() { c.kicks = make(chan struct{}, 1) })
	return c.kicks
}

// SetupWithManager runs Start in the manager and watches the webhook configuration, so
// that a re-applied configuration (caBundle emptied) gets its caBundle back at once.
func (c *Certs) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.Add(c); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("webhook-cabundle").
		For(&admissionregistrationv1.MutatingWebhookConfiguration{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			return o.GetName() == c.WebhookConfig
		}))).
		Complete(reconcile.Func(func(context.Context, reconcile.Request) (reconcile.Result, error) {
			select {
			case c.kick() <- struct{}{}:
			default:
			}
			return reconcile.Result{}, nil
		}))
}
