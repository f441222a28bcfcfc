# Rota on a real Kubernetes control plane, without Docker: Kubernetes 1.20 built
# once from Debian's source package, images built with buildah, the chart
# installed with helm. Included by the main Makefile (`-include mk/*.mk`).
# Everything built is cached in ROTA_CACHE (default ~/.cache/rota); the running
# cluster's state is in ROTA_CLUSTER_DIR (default /var/tmp/rota-cluster).
CLUSTER := $(PYTHON) tests/cluster/controlplane.py
CLUSTER_PYTEST_ARGS ?=

cluster-deps: ## install the Debian packages the local cluster and buildah need (as root)
	bash tests/cluster/deps.sh

kubernetes-local: cluster-deps ## build kube-apiserver, controller-manager, scheduler, kubelet, kube-proxy once (cached; 15-40 min cold on 2 cores)
	bash tests/cluster/build-kubernetes.sh

images-local: cluster-deps ## build the worker, operator and handler images with buildah from local Debian bases (trixie for the worker, bookworm for the operator)
	bash tests/cluster/images.sh build

# The previous release's images, for the upgrade of tests/cluster/test_production.py:
# the tree of PREVIOUS_REF (default: the commit in tests/cluster/previous-release,
# the last one of 0.3) exported to the cache and built as tag "previous" by its
# own images.sh.
CLUSTER_STATE := $(or $(ROTA_CLUSTER_DIR),/var/tmp/rota-cluster)
PREVIOUS_REF ?= $(shell cat tests/cluster/previous-release)
PREVIOUS_DIR := $(or $(ROTA_CACHE),$(HOME)/.cache/rota)/previous
images-previous: cluster-deps ## build the images of PREVIOUS_REF (tests/cluster/previous-release) as tag "previous", for the upgrade test
	rm -rf $(PREVIOUS_DIR) && mkdir -p $(PREVIOUS_DIR)
	@# A shallow clone lacks the previous release's commit: deepen it first.
	git cat-file -e $(PREVIOUS_REF)^{commit} 2>/dev/null || git fetch --quiet --unshallow
	git archive $(PREVIOUS_REF) | tar -x -C $(PREVIOUS_DIR)
	IMAGE_TAG=previous bash $(PREVIOUS_DIR)/tests/cluster/images.sh build

cluster-up: kubernetes-local ## start the local cluster (etcd, apiserver, controllers, kubelet on containerd); prints `export KUBECONFIG=...` last
	@$(CLUSTER) up

cluster-down: ## stop the local cluster and remove its state
	@$(CLUSTER) down

cluster-load: ## import the images-local images into the running cluster's containerd
	$(CLUSTER) load-images

# The cluster is stopped afterwards unless KEEP_CLUSTER=1; a failing run keeps
# its exit status.
test-cluster: $(STAMP) $(HELM) $(KUBECTL) kubernetes-local images-local images-previous ## the end-to-end run against the local cluster: helm install, operator, WorkerPool, kills, upgrades, two installations, TLS, uninstall
	@$(CLUSTER) up >/dev/null
	$(CLUSTER) load-images
	IMAGE_TAG=previous bash tests/cluster/images.sh load $(CLUSTER_STATE)/containerd/containerd.sock
	ROTA_CLUSTER_TESTS=1 $(BIN)/pytest -q -p no:cacheprovider tests/cluster $(CLUSTER_PYTEST_ARGS); \
	  status=$$?; [ -n "$(KEEP_CLUSTER)" ] || $(CLUSTER) down; exit $$status

.PHONY: cluster-deps kubernetes-local images-local images-previous cluster-up cluster-down cluster-load test-cluster
