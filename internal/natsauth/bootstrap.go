package natsauth

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// ServerBase is the part of nats-server's configuration that is not about identities:
// client port, monitoring, the payload a 1 MiB chunk plus headers needs, JetStream.
// Monitoring listens on the loopback interface only: its endpoints (/connz, /subsz,
// /jsz) answer without authentication and name every workflow's connections and
// subjects, so only a process in the NATS pod (kubectl exec, port-forward) reaches it.
const ServerBase = `listen: 0.0.0.0:4222
http: 127.0.0.1:8222
max_payload: 2MB
jetstream {
  store_dir: /data/jetstream
}
`

// Bootstrap returns the installation's NATS keys from Secret namespace/name, creating
// the Secret (fresh keys and the server configuration) when it does not exist. A Secret
// with a bad seed is an error naming the key; it is never overwritten.
func Bootstrap(ctx context.Context, c client.Client, namespace, name string) (Keys, error) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	var sec corev1.Secret
	err := c.Get(ctx, key, &sec)
	if err == nil {
		k := Keys{Operator: string(sec.Data[v1alpha1.SecretKeyNATSOperator]), System: string(sec.Data[v1alpha1.SecretKeyNATSSystem]), Account: string(sec.Data[v1alpha1.SecretKeyNATSAccount])}
		if err := k.Validate(); err != nil {
			return Keys{}, fmt.Errorf("the NATS keys in Secret %s: %w", key, err)
		}
		return k, nil
	}
	if !apierrors.IsNotFound(err) {
		return Keys{}, fmt.Errorf("reading Secret %s: %w", key, err)
	}
	k, err := GenerateKeys()
	if err != nil {
		return Keys{}, err
	}
	auth, err := k.ServerConfig()
	if err != nil {
		return Keys{}, err
	}
	sec = corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedBy}},
		Type:       corev1.SecretTypeOpaque,
		Data: map[string][]byte{
			v1alpha1.SecretKeyNATSOperator: []byte(k.Operator),
			v1alpha1.SecretKeyNATSSystem:   []byte(k.System),
			v1alpha1.SecretKeyNATSAccount:  []byte(k.Account),
			v1alpha1.SecretKeyNATSConfig:   []byte(ServerBase + auth),
		},
	}
	if err := c.Create(ctx, &sec); err != nil {
		if apierrors.IsAlreadyExists(err) { // another replica was first
			return Bootstrap(ctx, c, namespace, name)
		}
		return Keys{}, fmt.Errorf("creating Secret %s: %w", key, err)
	}
	return k, nil
}
