package main

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/certs"
	"github.com/sluice-io/sluice/internal/natsauth"
	"github.com/sluice-io/sluice/internal/transport"
	"github.com/sluice-io/sluice/internal/trust"
)

// installationTLS are the controller's flags for the TLS of the bundled NATS and MinIO.
type installationTLS struct {
	secret   string
	manage   bool
	services []string
	natsDir  string
}

func (o *installationTLS) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.secret, "tls-secret", "", "Secret (keys ca.crt, tls.crt, tls.key) of the CA and serving certificate of the bundled NATS and MinIO; "+
		"every client of theirs trusts ca.crt, which each workflow's configuration Secret carries (empty: no TLS)")
	f.BoolVar(&o.manage, "manage-tls-certs", true, "with --tls-secret: make the CA and issue, store and renew the serving certificate for --tls-services; "+
		"false: another issuer (cert-manager) writes the Secret, and the controller reads its ca.crt")
	f.StringSliceVar(&o.services, "tls-services", []string{"sluice-nats", "sluice-minio"}, "the Services (in --namespace) the serving certificate the controller issues is for, "+
		"besides 127.0.0.1 (the MinIO pod's own setup container)")
	f.StringVar(&o.natsDir, "nats-tls-dir", "", "where the NATS server finds tls.crt and tls.key of --tls-secret (the bundled one mounts them at "+natsauth.TLSDir+"): its configuration (nats.conf) then serves clients TLS only (empty: plain)")
}

// ensure returns the installation's CA certificate (nil with TLS off), issuing the CA
// and serving certificate into the Secret first when the controller manages them (the
// returned Certs then renews them once added to the manager), or waiting until another
// issuer has written the Secret's ca.crt.
func (o *installationTLS) ensure(ctx context.Context, c client.Client, namespace string, log logr.Logger) ([]byte, *certs.Certs, error) {
	if o.secret == "" {
		if o.natsDir != "" {
			return nil, nil, fmt.Errorf("--nats-tls-dir needs --tls-secret: the NATS server would have no certificate to serve")
		}
		return nil, nil, nil
	}
	var issuer *certs.Certs
	if o.manage {
		issuer = &certs.Certs{Client: c, Namespace: namespace, SecretName: o.secret, Name: "sluice-tls", Services: o.services,
			IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Log: log.WithName("tls")}
		if _, err := issuer.Ensure(ctx); err != nil {
			return nil, nil, err
		}
	}
	key := types.NamespacedName{Namespace: namespace, Name: o.secret}
	for attempt := 1; ; attempt++ {
		var sec corev1.Secret
		err := c.Get(ctx, key, &sec)
		if err == nil {
			ca := sec.Data[v1alpha1.SecretKeyCA]
			if _, err := trust.Config(ca); err != nil {
				return nil, nil, fmt.Errorf("--tls-secret %s: %s: %w", key, v1alpha1.SecretKeyCA, err)
			}
			return ca, issuer, nil
		}
		if o.manage || client.IgnoreNotFound(err) != nil {
			return nil, nil, fmt.Errorf("--tls-secret %s: %w", key, err)
		}
		if attempt%10 == 1 {
			log.Info("waiting for the TLS Secret another issuer writes", "secret", key.String())
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(3 * time.Second):
		}
	}
}

// natsTLS is the controller's NATS option with the installation's CA ca
// (transport.TLSOption); none when ca is empty.
func natsTLS(ca []byte) ([]nats.Option, error) {
	if len(ca) == 0 {
		return nil, nil
	}
	o, err := transport.TLSOption(ca)
	if err != nil {
		return nil, err
	}
	return []nats.Option{o}, nil
}
