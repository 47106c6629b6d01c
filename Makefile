# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
EXTRAS := all,torch,bench
export RAY_AUTH_MODE ?= disabled

.PHONY: install demo test test-fast system-deps services bench lint clean

$(STAMP): pyproject.toml operators/dedup/_minhash_c.c  # the C kernel is built at install
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip
	# torch 2.13.0 CPU is installed from this machine's disk; an unpinned torch pulls a CUDA build.
	$(BIN)/python -m pip install -q 'torch==2.13.0'
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]'
	touch $(STAMP)

install: $(STAMP)

## demo: fresh lake; the main job on the bundled corpus (embedded local Ray); release, export, read it back; the image-text and post-training demo jobs
demo: install
	rm -rf lake/demo lake/demo-cfs
	$(BIN)/datahub run jobs/demo.yaml
	$(BIN)/datahub inspect --lake lake/demo
	$(BIN)/datahub release create demo-v1 --lake lake/demo
	$(BIN)/datahub export demo-v1 --lake lake/demo --tier cfs --storage jobs/storage.demo.yaml --shard-samples 50
	$(BIN)/python -c "from datahub.loader import ReleaseDataset; ds = ReleaseDataset('demo-v1', lake='lake/demo'); \
	  print('ReleaseDataset read', sum(1 for _ in ds), 'samples of release demo-v1')"
	rm -rf lake/image-demo
	$(BIN)/datahub run jobs/image-demo.yaml  # image-text pairs: media checks, image filters, exact + pHash near-dup dedup
	rm -rf lake/chat-demo lake/preference-demo lake/trajectory-demo
	$(BIN)/datahub run jobs/chat-demo.yaml        # SFT conversations: per-turn checks, PII in messages, prompt dedup
	$(BIN)/datahub run jobs/preference-demo.yaml  # preference pairs
	$(BIN)/datahub run jobs/trajectory-demo.yaml  # agent trajectories (long episodes in 1,024-step segments)

## system-deps: Debian packages the test-suite needs (Ceph, Chromium); needs root, skipped otherwise
system-deps:
	bash .ci/system-deps.sh

## services: a single-host Ceph cluster with an S3 endpoint on 127.0.0.1 (tests use it)
services: system-deps
	bash .ci/ceph.sh start || echo "warning: Ceph did not start; Ceph tests skip outside CI and fail in CI"

## test: the whole suite (set-up included)
test: install services
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=15 tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "error: pytest collected no tests"; exit 1; fi; exit $$rc

test-fast: install
	$(BIN)/python -m pytest -q -p no:cacheprovider -x tests

bench: install
	for b in benchmarks/*.py; do case $$b in */_*) continue;; esac; echo "== $$b"; $(BIN)/python $$b || exit 1; done

lint: install
	$(BIN)/python -m mypy datahub

clean:
	rm -rf lake out build *.egg-info
