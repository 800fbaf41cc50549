// Package testutil holds the helpers Sluice's tests share: an in-process NATS server
// (NATS), a transport peer over its own node store (Peer), and a helper process, this
// test binary run again in another role, as the kubelet runs a sidecar in a container of
// its own (StartChild, Child, WaitToProceed). It is imported by _test.go files only.
//
// The transport package's own tests cannot import it (it imports the transport); they
// start their server with transport.StartEmbedded, as NATS does.
package testutil
