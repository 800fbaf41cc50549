package csidriver

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"github.com/sluice-io/sluice/internal/testenv"
)

// The driver passes csi-sanity (kubernetes-csi/csi-test), the CSI spec's conformance
// suite, over its real gRPC endpoint: the Identity and Node specs. Skipped, because the
// driver has no Controller service (it reports none in GetPluginCapabilities: ephemeral
// inline volumes are never provisioned): the "[Controller Server]" specs, which call the
// Controller service unconditionally, and "should remove target path", which provisions
// its volume with CreateVolume first; TestPublishIdempotent checks that removal on a
// published ephemeral volume.
func TestCSISanity(t *testing.T) {
	testenv.Root(t, "the driver mounts its node store")
	dir := t.TempDir()
	d, err := New(Options{NodeID: "sanity-node", StateDir: filepath.Join(dir, "state"), DiskTier: DiskTierDirectory})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	endpoint := filepath.Join(dir, "csi.sock")
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, endpoint) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	}()
	cfg := sanity.NewTestConfig()
	cfg.Address = "unix://" + endpoint
	cfg.TargetPath = filepath.Join(dir, "target")
	cfg.StagingPath = filepath.Join(dir, "staging")
	sc := sanity.GinkgoTest(&cfg)
	gomega.RegisterFailHandler(ginkgo.Fail)
	suite, reporter := ginkgo.GinkgoConfiguration()
	suite.SkipStrings = []string{`\[Controller Server\]`, "should remove target path"}
	reporter.Succinct = true
	ginkgo.RunSpecs(t, "CSI sanity", suite, reporter)
	sc.Finalize()
}
