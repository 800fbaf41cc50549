package podconfig

import (
	"fmt"
	"strings"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/trust"
)

// AgentSecretName is the name of the agent Secret of the Workflow whose UID is uid, in
// the agent namespace (v1alpha1.AgentSecretPrefix): a Workflow's UID is unique and
// fixed, so a Workflow deleted and made again under its name gets another Secret.
func AgentSecretName(uid string) string { return v1alpha1.AgentSecretPrefix + uid }

// Connection is the NATS connection of a workflow's serving peer on a node, as its agent
// Secret holds it (v1alpha1.AgentSecretPrefix).
type Connection struct {
	// URL is the NATS server's URL.
	URL string
	// Creds is the workflow's NATS credentials file (natsauth; empty: the server needs
	// none).
	Creds []byte
	// Inbox is the inbox prefix the credentials allow.
	Inbox string
	// CA is the installation's CA certificate (PEM) NATS serves TLS with; empty when it
	// does not.
	CA []byte
}

// agentKeys are the keys an agent Secret may hold, each with the most bytes it may hold.
var agentKeys = map[string]int{
	v1alpha1.SecretKeyNATSURL:        4 << 10,
	v1alpha1.SecretKeyNATSCreds:      16 << 10,
	v1alpha1.SecretKeyNATSInbox:      1 << 10,
	v1alpha1.SecretKeyInstallationCA: trust.MaxCA,
}

// Data returns the agent Secret's data.
func (c *Connection) Data() map[string][]byte {
	data := map[string][]byte{
		v1alpha1.SecretKeyNATSURL:   []byte(c.URL),
		v1alpha1.SecretKeyNATSCreds: c.Creds,
		v1alpha1.SecretKeyNATSInbox: []byte(c.Inbox),
	}
	if len(c.CA) > 0 {
		data[v1alpha1.SecretKeyInstallationCA] = c.CA
	}
	return data
}

// ParseConnection reads an agent Secret's data: only the keys of Connection.Data, each
// bounded in size, and a NATS URL. The error names the key.
func ParseConnection(data map[string][]byte) (*Connection, error) {
	for k, v := range data {
		limit, ok := agentKeys[k]
		if !ok {
			return nil, fmt.Errorf("agent Secret: unexpected key %q", k)
		}
		if len(v) > limit {
			return nil, fmt.Errorf("agent Secret: %s is %d bytes, more than %d", k, len(v), limit)
		}
	}
	c := &Connection{
		URL:   strings.TrimSpace(string(data[v1alpha1.SecretKeyNATSURL])),
		Creds: data[v1alpha1.SecretKeyNATSCreds],
		Inbox: strings.TrimSpace(string(data[v1alpha1.SecretKeyNATSInbox])),
		CA:    data[v1alpha1.SecretKeyInstallationCA],
	}
	if c.URL == "" {
		return nil, fmt.Errorf("agent Secret: no %s", v1alpha1.SecretKeyNATSURL)
	}
	return c, nil
}
