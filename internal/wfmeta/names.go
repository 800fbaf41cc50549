// Package wfmeta holds what a workflow is called in NATS and what its KV bucket records,
// apart from the data plane: the names of its stream, bucket and subjects (Names), the
// records of committed files, step terminations, pods' stats, reads and outcomes, and
// withdrawals, with their keys, and the functions that create, read and delete them
// given a jetstream.JetStream. The controller provisions and reads a workflow through
// it; the transport's peers (internal/transport) write the records from the data
// plane.
package wfmeta

import (
	"strconv"
	"strings"
)

// Names are the NATS names of one workflow. They derive from the namespace and the
// workflow's name, so that two workflows, or two namespaces, never share a subject, a
// stream or a bucket: namespaces are DNS labels and workflow names DNS subdomains, so
// neither holds "_", and mapping "." to "_" keeps them apart.
type Names struct {
	// Namespace is the workflow's Kubernetes namespace, as given: it picks the NATS
	// account of the workflow's stream and users (natsauth.Keys.NamespaceAccount).
	Namespace string
	// Stream is the JetStream stream holding events and data, SLUICE_<ns>_<workflow>.
	Stream string
	// Bucket is the KV bucket of file metadata (same name as the stream).
	Bucket string
	// Prefix is the subject prefix, sluice.<ns>.<workflow>.
	Prefix string
	// Inbox is the prefix of the workflow's reply subjects, _SLUICE_INBOX.<ns>.<workflow>
	// (nats.CustomInboxPrefix): outside Prefix, so the stream never captures a reply, and
	// per workflow, so credentials can allow a workflow's replies and nothing else.
	Inbox string
	// Fetch is the prefix of the workflow's data-plane subjects, _SLUICE_FETCH.<ns>.<workflow>
	// (core NATS request/reply, never stored): outside Prefix, so the stream never
	// captures a file's bytes, and per workflow, like Inbox.
	Fetch string
}

// NamesFor returns the names of workflow wf in namespace ns.
func NamesFor(ns, wf string) Names {
	namespace := ns
	ns = strings.ReplaceAll(ns, ".", "_")
	wf = strings.ReplaceAll(wf, ".", "_")
	return Names{
		Namespace: namespace,
		Stream:    "SLUICE_" + ns + "_" + wf,
		Bucket:    "SLUICE_" + ns + "_" + wf,
		Prefix:    "sluice." + ns + "." + wf,
		Inbox:     "_SLUICE_INBOX." + ns + "." + wf,
		Fetch:     "_SLUICE_FETCH." + ns + "." + wf,
	}
}

// NamesForWorkflow returns the names of the Kubernetes Workflow ns/name whose
// metadata.uid is uid: the first 8 characters of the UID are part of the workflow token,
// so a Workflow deleted and created again under the same name never meets its
// predecessor's stream, bucket or credentials.
func NamesForWorkflow(ns, name, uid string) Names {
	u := strings.ReplaceAll(uid, "-", "")
	if len(u) > 8 {
		u = u[:8]
	}
	if u == "" {
		return NamesFor(ns, name)
	}
	return NamesFor(ns, name+"-"+u)
}

// Events is the subject of a peer's metadata events: <prefix>.ev.<peer>.
func (n Names) Events(peer string) string { return n.Prefix + ".ev." + Token(peer) }

// Data is the subject of a peer's data chunks, <prefix>.data.<host>.<peer>: the host
// token lets a consumer select the chunks of the other hosts only.
func (n Names) Data(host, peer string) string {
	return n.Prefix + ".data." + Token(host) + "." + Token(peer)
}

// Serve is the subject on which the peers of host answer requests for byte ranges of the
// files written there: <fetch>.serve.<host> (a queue group: one peer answers each).
func (n Names) Serve(host string) string { return n.Fetch + ".serve." + Token(host) }

// Ensure is the subject on which the materialiser of host fetches byte ranges into the
// host's node store for the other peers of the host: <fetch>.ensure.<host>.
func (n Names) Ensure(host string) string { return n.Fetch + ".ensure." + Token(host) }

// Token makes s usable as one NATS subject token: ".", "*", ">" and white space (which
// would split or widen a subject) become "_". Kubernetes node and pod names are DNS
// subdomains, so distinct names stay distinct except for "." versus "_", which DNS names
// do not contain.
func Token(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '.', '*', '>', ' ', '\t', '\r', '\n':
			return '_'
		}
		return r
	}, s)
}

// All is the wildcard of every subject of the workflow.
func (n Names) All() string { return n.Prefix + ".>" }

// InstancePeer is the peer name of the sidecar serving instance (0-based) of step on a
// cluster. It names the instance, not the pod: a retried instance's new pod is the same
// peer restarted, so it replays its previous attempt's events and is home for the files
// that attempt created.
func InstancePeer(step string, instance int) string {
	return step + "-" + strconv.Itoa(instance)
}
