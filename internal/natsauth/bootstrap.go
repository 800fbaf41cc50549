package natsauth

import (
	"context"
	"fmt"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// Server-wide limits of the NATS server the controller configures (ServerBase): what all
// namespaces together may hold, whatever their accounts allow each
// (NamespaceQuota.Connections), so that the server's memory is bounded
// (docs/kubernetes.md, "NATS", sizes its pod's memory limit from them).
const (
	// ServerMaxConnections is the most client connections the server holds: four
	// namespaces at the default quota of 2,048 each.
	ServerMaxConnections = 8192
	// ServerMaxSubscriptions is the most subscriptions of one connection, of any user
	// (a workflow user's JWT says the same, MaxSubscriptions).
	ServerMaxSubscriptions = MaxSubscriptions
	// ServerMaxPending is the most bytes the server buffers for one connection that
	// does not read them (a slow consumer, which it then disconnects): a reader fetches
	// at most 8 chunks of 1 MiB from each holder at once.
	ServerMaxPending = 64 << 20
)

// ServerBase is the part of nats-server's configuration that is not about identities:
// client port, monitoring, the server-wide limits above, the payload a 1 MiB chunk plus
// headers needs, a write deadline (a client that takes longer to take its bytes is cut
// off), JetStream. Monitoring listens on the loopback interface only: its endpoints
// (/connz, /subsz, /jsz) answer without authentication and name every workflow's
// connections and subjects, so only a process in the NATS pod (kubectl exec,
// port-forward) reaches it.
var ServerBase = fmt.Sprintf(`listen: 0.0.0.0:4222
http: 127.0.0.1:8222
max_connections: %d
max_subscriptions: %d
max_pending: %d
max_payload: 2MB
write_deadline: "10s"
jetstream {
  store_dir: /data/jetstream
}
`, ServerMaxConnections, ServerMaxSubscriptions, ServerMaxPending)

// TLSDir is where the bundled NATS pod mounts its serving certificate (tls.crt, tls.key
// of the TLS Secret) when the installation serves TLS.
const TLSDir = "/etc/nats-tls"

// ServerTLS is the tls block of nats-server's configuration that makes its client port
// TLS only, with the certificate and key in dir: a client that does not speak TLS, or
// does not trust the certificate's CA, is refused. Monitoring (ServerBase) stays plain on
// the loopback interface.
func ServerTLS(dir string) string {
	return fmt.Sprintf("tls {\n  cert_file: %q\n  key_file: %q\n  timeout: 5\n}\n",
		path.Join(dir, corev1.TLSCertKey), path.Join(dir, corev1.TLSPrivateKeyKey))
}

// hasTLS says whether conf serves TLS as ServerTLS(dir) does ("" dir: not at all).
func hasTLS(conf, dir string) bool {
	if dir == "" {
		return !strings.Contains(conf, "\ntls {")
	}
	return strings.Contains(conf, "\n"+ServerTLS(dir))
}

// Bootstrap returns the installation's NATS keys from Secret namespace/name, creating
// the Secret (fresh keys and the server configuration with quota q, serving TLS with the
// certificate in tlsDir unless it is empty) when it does not exist. A Secret with a bad
// seed is an error naming the key; it is never overwritten. When the Secret's
// configuration bounds the installation's workflow account otherwise than q (the quota
// was changed), predates quotas or namespace accounts (no full resolver) or the
// server-wide limits (it does not start with ServerBase), or serves TLS otherwise than
// tlsDir says, Bootstrap writes it anew with the same keys and reports rewrote: the NATS
// server applies it when it restarts.
func Bootstrap(ctx context.Context, c client.Client, namespace, name string, q Quota, tlsDir string) (k Keys, rewrote bool, err error) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	var sec corev1.Secret
	err = c.Get(ctx, key, &sec)
	if err == nil {
		k := Keys{Operator: string(sec.Data[v1alpha1.SecretKeyNATSOperator]), System: string(sec.Data[v1alpha1.SecretKeyNATSSystem]), Account: string(sec.Data[v1alpha1.SecretKeyNATSAccount])}
		if err := k.Validate(); err != nil {
			return Keys{}, false, fmt.Errorf("the NATS keys in Secret %s: %w", key, err)
		}
		have := string(sec.Data[v1alpha1.SecretKeyNATSConfig])
		if hq, ok := k.ConfiguredQuota(have); ok && hq == q && hasTLS(have, tlsDir) && strings.HasPrefix(have, ServerBase) {
			return k, false, nil
		}
		conf, err := serverConfig(k, q, tlsDir)
		if err != nil {
			return Keys{}, false, err
		}
		sec.Data[v1alpha1.SecretKeyNATSConfig] = conf
		if err := c.Update(ctx, &sec); err != nil {
			return Keys{}, false, fmt.Errorf("writing the NATS quota into Secret %s: %w", key, err)
		}
		return k, true, nil
	}
	if !apierrors.IsNotFound(err) {
		return Keys{}, false, fmt.Errorf("reading Secret %s: %w", key, err)
	}
	if k, err = GenerateKeys(); err != nil {
		return Keys{}, false, err
	}
	conf, err := serverConfig(k, q, tlsDir)
	if err != nil {
		return Keys{}, false, err
	}
	sec = corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedBy}},
		Type:       corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			v1alpha1.SecretKeyNATSOperator: []byte(k.Operator),
			v1alpha1.SecretKeyNATSSystem:   []byte(k.System),
			v1alpha1.SecretKeyNATSAccount:  []byte(k.Account),
			v1alpha1.SecretKeyNATSConfig:   conf,
		},
	}
	if err := c.Create(ctx, &sec); err != nil {
		if apierrors.IsAlreadyExists(err) { // another replica was first
			return Bootstrap(ctx, c, namespace, name, q, tlsDir)
		}
		return Keys{}, false, fmt.Errorf("creating Secret %s: %w", key, err)
	}
	return k, false, nil
}

// serverConfig is nats-server's whole configuration file for keys k and quota q, serving
// TLS with the certificate in tlsDir unless it is empty.
func serverConfig(k Keys, q Quota, tlsDir string) ([]byte, error) {
	auth, err := k.ServerConfig(q)
	if err != nil {
		return nil, err
	}
	conf := ServerBase
	if tlsDir != "" {
		conf += ServerTLS(tlsDir)
	}
	return []byte(conf + auth), nil
}
