package controller

import (
	"crypto/tls"

	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// HTTP1Only is a webhook.Options TLSOpts function that makes the server offer only
// HTTP/1.1 during the TLS handshake (ALPN). The API server calls admission webhooks over
// HTTP/1.1 anyway; without this, controller-runtime offers h2 too, which puts Go's
// HTTP/2 server, the part of net/http with the most denial-of-service fixes (some as
// recent as Go 1.26.10), within reach of every client that reaches the port.
func HTTP1Only(c *tls.Config) {
	c.NextProtos = []string{"http/1.1"}
}

// NewWebhookServer is webhook.NewServer with HTTP1Only added to opts.TLSOpts: the server
// the controller serves the pod injection webhook on.
func NewWebhookServer(opts webhook.Options) webhook.Server {
	opts.TLSOpts = append(append([]func(*tls.Config){}, opts.TLSOpts...), HTTP1Only)
	return webhook.NewServer(opts)
}
