// Package volumemark signs and checks the attributes of Sluice's CSI ephemeral inline
// volumes, so that the privileged node plugin publishes a volume only for a pod the
// controller or the webhook injected (docs/security.md, "Node plugin").
//
// A pod chooses its volumes' attributes; the kubelet adds the pod's namespace, name and
// UID (podInfoOnMount), which the pod cannot choose. The injector adds the attribute
// v1alpha1.VolumeAttrMark: an HMAC-SHA256, under a key only the controller (which
// injects) and the node plugins hold, over the namespace, the Workflow's name and UID,
// the step, instance, role and mode. A pod that writes its own csi.sluice.io volume
// cannot compute it, and one that copies another pod's attributes gets exactly what that
// pod had: the same workflow of its own namespace. The node plugin recomputes it at
// NodePublishVolume and then checks with the API that the Workflow still has that UID.
package volumemark

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// KeySize is the size in bytes of a mark key.
const KeySize = 32

// SecretKey is the data key of the mark key in its Secret.
const SecretKey = "key"

// Mark is what a volume's mark covers.
type Mark struct {
	// Namespace is the pod's (and the Workflow's) namespace.
	Namespace string
	// Workflow and WorkflowUID name the Workflow the volume belongs to.
	Workflow, WorkflowUID string
	// Step and Instance are the step instance the pod runs (role app).
	Step     string
	Instance int
	// Role and Mode are the volume's v1alpha1.VolumeAttrRole and VolumeAttrMode.
	Role, Mode string
}

// message is the byte string the HMAC covers: a version and each field, NUL-separated
// (no field can hold a NUL: they are Kubernetes names, a UID, numbers and fixed words).
func (m Mark) message() []byte {
	return []byte(strings.Join([]string{"sluice.io/mark/v1", m.Namespace, m.Workflow, m.WorkflowUID,
		m.Step, strconv.Itoa(m.Instance), m.Role, m.Mode}, "\x00"))
}

// Sign returns the mark of m under key, as the base64url text of its HMAC-SHA256 (43
// characters).
func Sign(key []byte, m Mark) string {
	h := hmac.New(sha256.New, key)
	h.Write(m.message())
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}

// ErrNoMark and ErrBadMark are Verify's errors.
var (
	ErrNoMark  = errors.New("the volume carries no mark: csi.sluice.io volumes are made by the Sluice controller or webhook, not written in a pod's spec")
	ErrBadMark = errors.New("the volume's mark does not match its attributes: they were not written by the Sluice controller or webhook")
)

// Verify checks that mark is m's under key, in constant time. It returns ErrNoMark for
// an empty mark and ErrBadMark for any other mismatch.
func Verify(key []byte, m Mark, mark string) error {
	if mark == "" {
		return ErrNoMark
	}
	got, err := base64.RawURLEncoding.DecodeString(mark)
	if err != nil {
		return ErrBadMark
	}
	h := hmac.New(sha256.New, key)
	h.Write(m.message())
	if !hmac.Equal(got, h.Sum(nil)) {
		return ErrBadMark
	}
	return nil
}

// LoadKey reads a mark key from a file (the node plugin's mounted Secret). It fails
// unless the file holds exactly KeySize bytes.
func LoadKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the volume mark key: %w", err)
	}
	if len(b) != KeySize {
		return nil, fmt.Errorf("the volume mark key %s holds %d bytes, want %d", path, len(b), KeySize)
	}
	return b, nil
}

// Bootstrap returns the mark key kept in Secret namespace/name (data key SecretKey),
// creating the Secret with a new random key if it does not exist. Several replicas may
// race: the one whose create fails with AlreadyExists reads the winner's key. It fails if
// the Secret holds a key of the wrong size; errors are the API's, wrapped.
func Bootstrap(ctx context.Context, c client.Client, namespace, name string) ([]byte, error) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	var sec corev1.Secret
	err := c.Get(ctx, key, &sec)
	if err == nil {
		k := sec.Data[SecretKey]
		if len(k) != KeySize {
			return nil, fmt.Errorf("the Secret %s: %q holds %d bytes, want %d", key, SecretKey, len(k), KeySize)
		}
		return k, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("reading Secret %s: %w", key, err)
	}
	k := make([]byte, KeySize)
	if _, err := rand.Read(k); err != nil {
		return nil, err
	}
	sec = corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedBy}},
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{SecretKey: k},
	}
	if err := c.Create(ctx, &sec); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return Bootstrap(ctx, c, namespace, name)
		}
		return nil, fmt.Errorf("creating Secret %s: %w", key, err)
	}
	return k, nil
}
