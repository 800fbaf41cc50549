// Package certs keeps serving certificates without cert-manager: a self-signed CA and a
// certificate for one or more Services, stored in a Secret, and renewed before they
// expire (Certs). The controller keeps two: the pod injection webhook's (written for the
// webhook server and patched into the MutatingWebhookConfiguration's caBundle) and, with
// TLS on, the bundled NATS and MinIO's (mounted by their pods; the CA reaches every
// client). With cert-manager (deploy/overlays/cert-manager) the controller leaves the
// webhook's certificate to it.
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
	"net"
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

// caLifetimes is how many certificates' validity a new CA has: it signs the renewed
// certificates for years, so its clients (which hold only the CA) keep trusting them.
const caLifetimes = 10

// Certs manages a serving certificate without cert-manager: a self-signed CA and a
// serving certificate for Services, kept in a Secret of type kubernetes.io/tls with the
// CA's certificate and key beside it (ca.crt, ca.key), so every replica and restart
// serves the same. The certificate is renewed when a third of its validity remains,
// signed by the same CA while the CA outlives it; the CA, made for caLifetimes
// certificates, is replaced only then. For the webhook it is also written to CertDir for
// the webhook server (which reloads changed files), and the CA patched into the
// MutatingWebhookConfiguration's caBundle.
type Certs struct {
	// Client reads and writes the Secret and the webhook configuration (uncached).
	Client client.Client
	// Namespace and SecretName locate the Secret; Services are the names of the Services
	// (in Namespace) the certificate is for; WebhookConfig is the
	// MutatingWebhookConfiguration whose caBundle is kept (empty: none).
	Namespace, SecretName, WebhookConfig string
	Services                             []string
	// IPs are addresses the certificate is for as well: the loopback address, for a
	// client in the server's own pod.
	IPs []net.IP
	// Name names the certificate in logs and errors, and its CA ("<Name>-ca"); empty:
	// sluice-webhook.
	Name string
	// CertDir receives tls.crt and tls.key (empty: nothing is written).
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

func (c *Certs) name() string {
	if c.Name == "" {
		return "sluice-webhook"
	}
	return c.Name
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
		return time.Time{}, fmt.Errorf("reading the %s certificate Secret %s: %w", c.name(), key, err)
	}
	renewAt, valid := c.check(sec.Data)
	if !valid {
		data, err := c.issue(sec.Data)
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
			return time.Time{}, fmt.Errorf("storing the %s certificate in Secret %s: %w", c.name(), key, err)
		}
		renewAt, _ = c.check(sec.Data)
		c.Log.Info("issued a serving certificate", "name", c.name(), "secret", key.String(), "renewAt", renewAt)
	}
	if err := c.writeFiles(sec.Data); err != nil {
		return time.Time{}, err
	}
	if c.WebhookConfig != "" {
		if err := c.PatchCABundle(ctx, sec.Data[v1alpha1.SecretKeyCA]); err != nil {
			return time.Time{}, err
		}
	}
	return renewAt, nil
}

// check reports when the stored certificate must be renewed and whether it is usable
// now (present, matching its key, for every Service and IP, signed by the stored CA).
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
	hosts := make([]string, 0, len(c.Services)+len(c.IPs))
	for _, s := range c.Services {
		hosts = append(hosts, s+"."+c.Namespace+".svc")
	}
	for _, ip := range c.IPs {
		hosts = append(hosts, ip.String())
	}
	for _, h := range hosts {
		if _, err := leaf.Verify(x509.VerifyOptions{DNSName: h, Roots: pool, CurrentTime: c.now()}); err != nil {
			return time.Time{}, false
		}
	}
	renewAt := leaf.NotAfter.Add(-leaf.NotAfter.Sub(leaf.NotBefore) / 3)
	return renewAt, c.now().Before(renewAt)
}

// dnsNames are the names of every Service in Namespace, the ".svc" one of the first
// Service first (the certificate's common name).
func (c *Certs) dnsNames() []string {
	var names []string
	for _, s := range c.Services {
		ns := c.Namespace
		names = append(names, s+"."+ns+".svc", s, s+"."+ns, s+"."+ns+".svc.cluster.local")
	}
	return names
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	return n
}

func pemKey(k *ecdsa.PrivateKey) ([]byte, error) {
	b, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: b}), nil
}

// storedCA returns the CA in data (ca.crt, ca.key) when it is usable to sign a certificate
// valid until notAfter: a CA certificate valid from now until then, whose key is ca.key.
// Nil otherwise.
func storedCA(data map[string][]byte, now, notAfter time.Time) (*x509.Certificate, *ecdsa.PrivateKey) {
	certBlock, _ := pem.Decode(data[v1alpha1.SecretKeyCA])
	keyBlock, _ := pem.Decode(data[v1alpha1.SecretKeyCAKey])
	if certBlock == nil || keyBlock == nil {
		return nil, nil
	}
	ca, err := x509.ParseCertificate(certBlock.Bytes)
	if err != nil || !ca.IsCA || now.Before(ca.NotBefore) || ca.NotAfter.Before(notAfter) {
		return nil, nil
	}
	key, err := x509.ParseECPrivateKey(keyBlock.Bytes)
	if err != nil {
		return nil, nil
	}
	if pub, ok := ca.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		return nil, nil
	}
	return ca, key
}

// issue returns a new serving certificate (ECDSA P-256) for the Services and IPs, signed
// by the CA in old when it outlives the certificate, else by a new CA (of caLifetimes
// times the validity).
func (c *Certs) issue(old map[string][]byte) (map[string][]byte, error) {
	validity := c.Validity
	if validity <= 0 {
		validity = defaultValidty
	}
	now := c.now().Add(-time.Minute)
	ca, caKey := storedCA(old, now, now.Add(validity))
	caPEM, caKeyPEM := old[v1alpha1.SecretKeyCA], old[v1alpha1.SecretKeyCAKey]
	if ca == nil {
		var err error
		if caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			return nil, fmt.Errorf("generating the %s CA key: %w", c.name(), err)
		}
		caTmpl := &x509.Certificate{
			SerialNumber: serial(), Subject: pkix.Name{CommonName: c.name() + "-ca"},
			NotBefore: now, NotAfter: now.Add(caLifetimes * validity), IsCA: true, BasicConstraintsValid: true,
			KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		}
		caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
		if err != nil {
			return nil, fmt.Errorf("signing the %s CA: %w", c.name(), err)
		}
		ca, _ = x509.ParseCertificate(caDER)
		caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
		if caKeyPEM, err = pemKey(caKey); err != nil {
			return nil, err
		}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating the %s key: %w", c.name(), err)
	}
	names := c.dnsNames()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), DNSNames: names, IPAddresses: c.IPs,
		NotBefore: now, NotAfter: now.Add(validity),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if len(names) > 0 {
		tmpl.Subject = pkix.Name{CommonName: names[0]}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("signing the %s certificate: %w", c.name(), err)
	}
	keyPEM, err := pemKey(key)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{
		v1alpha1.SecretKeyCA:    caPEM,
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
		return fmt.Errorf("the %s certificate directory: %w", c.name(), err)
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
			c.Log.Error(err, "serving certificate", "name", c.name())
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

// SetupWithManager runs Start in the manager and, with a WebhookConfig, watches the
// webhook configuration, so that a re-applied configuration (caBundle emptied) gets its
// caBundle back at once.
func (c *Certs) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.Add(c); err != nil {
		return err
	}
	if c.WebhookConfig == "" {
		return nil
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
