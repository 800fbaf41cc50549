# Sluice build, test and generation targets. Run `make help` for the list.

SHELL := /usr/bin/env bash
GO ?= go
BIN ?= bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
IMAGE ?= sluice:$(VERSION)

# Pinned tool versions, run with `go run` so nothing has to be installed by hand.
CONTROLLER_GEN := $(GO) run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.20.0

# Fuzz budget per target in `make fuzz` (CI uses the default).
FUZZTIME ?= 20s

# pjdfstest's source tree for `make conformance` (hack/pjdfstest.sh builds it, cached).
PJDFSTEST_SRC ?= ../shared/tools/pjdfstest

.PHONY: help
help: ## Show this help.
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-14s %s\n", $$1, $$2}'

.PHONY: build
build: ## Build the sluice binary (the image's one binary) and sluice-bench into bin/.
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/sluice ./cmd/sluice
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/sluice-bench ./cmd/sluice-bench

.PHONY: demo
demo: build ## Run examples/wordcount with sluice run (needs root and /dev/fuse) and show the result.
	$(BIN)/sluice run examples/wordcount/workflow.yaml --out sluice-out/wordcount
	@echo
	@echo "Result: sluice-out/wordcount/result/wordcount.txt (count, word), top 10:"
	@head -n 10 sluice-out/wordcount/result/wordcount.txt

.PHONY: bench
bench: build servers ## Run sluice-bench (quick profile) and the Go hot-path benchmarks; results in bench/results/.
	$(BIN)/sluice-bench --out bench/results
	$(GO) test -run '^$$' -bench . -benchmem ./internal/semantics/ ./internal/transport/ | tee bench/results/go-bench.txt

.PHONY: generate
generate: ## Regenerate deepcopy code and the CRD YAML in crds/.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...
	$(CONTROLLER_GEN) crd:allowDangerousTypes=false paths=./api/... output:crd:artifacts:config=crds
	cp crds/sluice.io_workflows.yaml charts/sluice/crds/

.PHONY: verify
verify: ## Fail if generated files are stale, go vet or golangci-lint (.golangci.yml) complains, gofmt would change a file, or govulncheck finds a reachable vulnerability.
	@./hack/verify.sh

.PHONY: deps
deps: ## Install the system packages the tests run that are missing (hack/install-deps.sh; apt, as root).
	./hack/install-deps.sh

# The README's command. Its phases run one after the other, also under `make -j`: first
# what the tests run (make deps), then verify, integration and fuzz. integration's
# `go test ./...` runs every unit test too, so make test does not run make unit again.
.PHONY: test
test: deps ## make deps, make verify, make integration (every test, the unit tests included), then the fuzz smoke.
	$(MAKE) verify
	$(MAKE) integration
	$(MAKE) fuzz

.PHONY: unit
unit: ## The unit tests: no root, no FUSE, no server but an in-process NATS, no binary outside the module; under a minute (go test -short).
	$(GO) test -short -count=1 ./...

# hack/confine.sh fails the run when a test left files outside its temporary directories
# (t.TempDir()) and the caches; hack/heartbeat.sh names, at least once a minute, the
# packages being built and the test binaries running.
.PHONY: integration
integration: deps servers envtest-assets tools ## Every test, as root (FUSE, nats-server, MinIO, envtest), race detector on; the view's contract suite again with FUSE passthrough off; fails if a test writes outside its temporary directories.
	KUBEBUILDER_ASSETS="$$(./hack/cluster/build.sh envtest)" ./hack/confine.sh ./hack/heartbeat.sh "go test ./..." $(GO) test -race -count=1 ./...
	./hack/confine.sh ./hack/heartbeat.sh "go test ./internal/streamfs/ (passthrough off)" $(GO) test -race -count=1 ./internal/streamfs/ -args -passthrough=off

.PHONY: docs-check
docs-check: ## Run the commands quoted in README.md and docs/ and compare what they print (root, FUSE; UPDATE=1 rewrites the blocks that differ).
	$(GO) test -count=1 -run 'TestDocs|TestDocBlocksAreMarked|TestWorkflowReferenceNamesEveryField' ./internal/docscheck/ $(if $(UPDATE),-args -update)

.PHONY: conformance
conformance: build ## Run pjdfstest on tmpfs and in a Sluice volume (ungoverned and governed paths) side by side (root; PJDFSTEST_SRC).
	PJDFSTEST_SRC=$(PJDFSTEST_SRC) ./hack/conformance.sh

.PHONY: envtest-assets
envtest-assets: ## Build (once, cached) kube-apiserver, etcd, kube-scheduler, kube-controller-manager and kwok for the controller, webhook and placement scale tests.
	@./hack/cluster/build.sh envtest >/dev/null

.PHONY: servers
servers: ## Build the pinned nats-server, MinIO and versitygw the tests run (cached in ~/.cache/sluice).
	@./hack/servers.sh build

.PHONY: tools
tools: ## Build (once, cached) the pinned helm and promtool the checks run.
	@./hack/tools.sh helm >/dev/null
	@./hack/tools.sh promtool >/dev/null

.PHONY: fuzz
fuzz: ## Run each native fuzz target for FUZZTIME; crashers land in testdata/fuzz.
	@./hack/fuzz.sh $(FUZZTIME)

.PHONY: image
image: ## Build the container image (needs a Docker engine).
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE) .

KIND_CLUSTER ?= sluice

.PHONY: kind-up
kind-up: ## Create a kind cluster and load the sluice image into it (needs kind and a Docker engine).
	kind create cluster --name $(KIND_CLUSTER)
	docker build --build-arg VERSION=$(VERSION) -t sluice:dev .
	kind load docker-image sluice:dev --name $(KIND_CLUSTER)

.PHONY: deploy
deploy: ## Install Sluice into the current kubectl context (deploy/overlays/kind).
	kubectl apply -k deploy/overlays/kind
	kubectl -n sluice-system rollout status deployment/sluice-controller --timeout=180s
	kubectl -n sluice-system rollout status daemonset/sluice-csi --timeout=180s
	kubectl -n sluice-system rollout status statefulset/sluice-nats --timeout=180s

E2E_FLAGS ?= -v -ginkgo.v -timeout 30m

.PHONY: e2e
e2e: ## Run the e2e suite against the cluster of the current KUBECONFIG (installs deploy/overlays/kind).
	E2E_DEPLOY=$${E2E_DEPLOY:-deploy/overlays/kind} $(GO) test -tags e2e -count=1 ./e2e/ $(E2E_FLAGS)

NODES ?= 1

.PHONY: e2e-local
e2e-local: ## Bring up the local cluster (hack/cluster/local.sh, root; NODES=3 for three nodes) and run the e2e suite on it (E2E_INSTALL=helm installs with the chart).
	./hack/cluster/local.sh up --nodes $(NODES)
	eval "$$(./hack/cluster/local.sh env)" && E2E_DEPLOY=deploy/overlays/local E2E_IMAGE=localhost/busybox:e2e \
		E2E_PULL_POLICY=Never $(GO) test -tags e2e -count=1 ./e2e/ $(E2E_FLAGS) $(if $(E2E_LABELS),-ginkgo.label-filter='$(E2E_LABELS)')

# The engine specs (e2e/airflow_test.go: label "engines") run real workflow engines, installed by hack/engines/ (pinned, cached in ~/.cache/sluice).
# E2E_LABELS filters the suite by Ginkgo label, e.g. E2E_LABELS='!engines' to skip them.
.PHONY: e2e-engines
e2e-engines: ## Bring up the local cluster (NODES=3 for three nodes) and run only the engine specs on it: Airflow 3 running the recipe of examples/recipes/airflow.
	./hack/cluster/local.sh up --nodes $(NODES)
	eval "$$(./hack/cluster/local.sh env)" && E2E_DEPLOY=deploy/overlays/local E2E_IMAGE=localhost/busybox:e2e \
		E2E_PULL_POLICY=Never $(GO) test -tags e2e -count=1 ./e2e/ $(E2E_FLAGS) -ginkgo.label-filter=engines

.PHONY: local-down
local-down: ## Stop the local cluster and remove its state.
	./hack/cluster/local.sh down

.PHONY: clean
clean: ## Remove build output.
	rm -rf $(BIN)
