package transport

import "strings"

// Names are the NATS names of one workflow. They derive from the namespace and the
// workflow's name, so that two workflows, or two namespaces, never share a subject, a
// stream or a bucket: namespaces are DNS labels and workflow names DNS subdomains, so
// neither holds "_", and mapping "." to "_" keeps them apart.
type Names struct {
	// Stream is the JetStream stream holding events and data, SLUICE_<ns>_<workflow>.
	Stream string
	// Bucket is the KV bucket of file metadata (same name as the stream).
	Bucket string
	// Prefix is the subject prefix, sluice.<ns>.<workflow>.
	Prefix string
}

// NamesFor returns the names of workflow wf in namespace ns.
func NamesFor(ns, wf string) Names {
	ns = strings.ReplaceAll(ns, ".", "_")
	wf = strings.ReplaceAll(wf, ".", "_")
	return Names{
		Stream: "SLUICE_" + ns + "_" + wf,
		Bucket: "SLUICE_" + ns + "_" + wf,
		Prefix: "sluice." + ns + "." + wf,
	}
}

// Events is the subject of a node's metadata events.
func (n Names) Events(node string) string { return n.Prefix + ".ev." + node }

// Data is the subject of a node's data chunks.
func (n Names) Data(node string) string { return n.Prefix + ".data." + node }

// All is the wildcard of every subject of the workflow.
func (n Names) All() string { return n.Prefix + ".>" }
