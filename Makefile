# simlab: `make run` (default simulation) and `make test` (test suite) on a fresh machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test test-all bench bench-peers lint clean crosscheck crosscheck-geometry paper docs

## The dependencies are byte-compiled at install: with PYTHONDONTWRITEBYTECODE set (as on this
## project's machines) nothing compiled later is kept: every process would compile its imports again.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,gpu,fast]'
	$(BIN)/python -m compileall -q simlab policies traces hydra_plugins
	touch $(STAMP)

install: $(STAMP)

## Default simulation: the standard policy set on the paper's ShareGPT selection.
run: $(STAMP)
	$(BIN)/python -m simlab $(ARGS)

## Test suite (what CI runs), spread over the machine's cores by pytest-xdist (TEST_WORKERS=0:
## one process); rewriting the goldens (SIMLAB_UPDATE_GOLDENS=1) always runs in one process,
## since every golden test rewrites its shared JSON file.
TEST_WORKERS ?= auto
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(if $(filter 1,$(SIMLAB_UPDATE_GOLDENS)),0,$(TEST_WORKERS)) \
		$(PYTEST_ARGS)

## Replay and timed-engine speed per policy on the real traces, then the side-by-side runs against
## the peer simulators (bench-peers) and the Marconi reference code (when MARCONI_REFERENCE_DIR
## names a checkout of it; skipped otherwise), and what loading a compiled kernel costs a fresh
## process (bench/numba_load.py, printed), and time and peak memory at 100K and 1M requests
## (bench/scale.py, about 25 minutes); writes bench/results/.
bench: $(STAMP)
	$(BIN)/python -m bench.speed $(ARGS)
	$(BIN)/python -m bench.peers $(PEERS_ARGS)
	$(BIN)/python -m bench.reference_speed
	$(BIN)/python -m bench.numba_load
	$(BIN)/python -m bench.scale

## simlab beside kvcache-simulator and DynoSim on the Mooncake-format trace (bench/peers.py):
## installs them into .bench-peers/ (throwaway venvs; skipped with a message when they cannot be
## installed), about 7 min on 2 cores; writes bench/results/peers.json. PEERS_ARGS="--repeat 1".
bench-peers: $(STAMP)
	$(BIN)/python -m bench.peers $(PEERS_ARGS)

## The Marconi paper's published numbers beside simlab's (paper mode and default semantics):
## runs/paper/paper.md and paper.pdf, about 6 min on 2 cores; ARGS=--quick for a 1.5-minute subset
## in runs/paper-quick. A rerun resumes (finished points are skipped).
paper: $(STAMP)
	$(BIN)/python -m simlab.paper $(ARGS)

## The documentation site (mkdocs-material): docs/, checked in strict mode (every page in the nav,
## every link and anchor resolved); docs/reference/configuration.md is regenerated from
## simlab/config.py and configs/ first (docs/hooks.py). Writes site/.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

lint: $(STAMP)
	$(BIN)/ruff check simlab policies traces gpu_validate hydra_plugins tests bench examples crosscheck
	$(BIN)/mypy
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache .mypy_cache .ruff_cache

## Regenerate tests/fixtures/crosscheck/ (and crosscheck_load/, under load) by driving SGLang's
## and vLLM's own prefix caches on the CPU over simlab's request sequence (crosscheck/README.md).
## Slow, and not part of CI. Set XC_WHEELS to a folder holding the sglang/vllm wheels to skip
## downloading them.
XC_VENV := .venv-crosscheck
XC_BIN := $(XC_VENV)/bin
XC_STAMP := $(XC_VENV)/.installed
XC_OUT := .crosscheck
XC_FIXTURES := tests/fixtures/crosscheck
XC_LOAD := tests/fixtures/crosscheck_load
XC_LOAD_SGL := tests/fixtures/crosscheck_load_sglang
XC_WHEELS ?=
XC_SHARE := $(XC_OUT)/sharegpt_llama3_8b.npz
XC_SHARE_H := $(XC_OUT)/sharegpt_nemotron_h_8b.npz
XC_SWE := $(XC_OUT)/swebench10_llama3_8b.npz
XC_SWE_H := $(XC_OUT)/swebench10_nemotron_h_8b.npz
XC_MOON := $(XC_OUT)/mooncake_llama3_8b.npz
XC_MOON_LOAD := $(XC_OUT)/mooncake2000_llama3_8b.npz

$(XC_STAMP): crosscheck/requirements.txt
	python3.11 -m venv $(XC_VENV)
	$(XC_BIN)/pip install --quiet --upgrade pip
	$(XC_BIN)/pip install --quiet torch==2.13.0
	$(XC_BIN)/pip install --quiet --no-deps $(if $(XC_WHEELS),--find-links $(XC_WHEELS)) \
		sglang==0.5.23 vllm==0.33.0
	$(XC_BIN)/pip install --quiet -r crosscheck/requirements.txt
	touch $(XC_STAMP)

## vLLM's hybrid geometry (forced block size, state pages and dtypes) for every hybrid config.json
## aiconfigurator-core bundles, by vLLM's own code (crosscheck/geometry.py): writes
## tests/fixtures/crosscheck/geometry.json; `python -m simlab.crosscheck geometry` compares it.
crosscheck-geometry: $(STAMP) $(XC_STAMP)
	$(XC_BIN)/python -m crosscheck.geometry --configs \
		"$$($(BIN)/python -c 'import aiconfigurator_core, pathlib; print(pathlib.Path(aiconfigurator_core.__file__).parent / "model_configs")')"

crosscheck: $(STAMP) $(XC_STAMP) crosscheck-geometry
	$(BIN)/python -m crosscheck.export --out $(XC_SHARE) trace=sharegpt model=llama3_8b
	$(BIN)/python -m crosscheck.export --out $(XC_SHARE_H) trace=sharegpt model=nemotron_h_8b
	$(BIN)/python -m crosscheck.export --out $(XC_SWE) trace=swebench trace.limit=10 model=llama3_8b
	$(BIN)/python -m crosscheck.export --out $(XC_SWE_H) trace=swebench trace.limit=10 model=nemotron_h_8b
	$(BIN)/python -m crosscheck.export --out $(XC_MOON) trace=mooncake model=llama3_8b \
		arrivals.mode=timestamps
	$(BIN)/python -m crosscheck.export --outputs trace --out $(XC_MOON_LOAD) trace=mooncake \
		trace.limit=2000 model=llama3_8b
	rm -f $(XC_FIXTURES)/*.csv $(XC_FIXTURES)/manifest.json
	$(XC_BIN)/python -m crosscheck.sglang_radix --export $(XC_SHARE) --name sharegpt_llama3_8b \
		--cache radix unified --size-gb inf 2 5 --rust-check
	$(XC_BIN)/python -m crosscheck.sglang_radix --export $(XC_SHARE) --name sharegpt_llama3_8b \
		--cache radix unified --size-gb inf 2 5 --page-size 16 --rust-check
	$(XC_BIN)/python -m crosscheck.sglang_radix --export $(XC_SHARE) --name sharegpt_llama3_8b \
		--cache radix --size-gb inf 2 5 --page-size 64
	$(XC_BIN)/python -m crosscheck.vllm_blocks --export $(XC_SHARE) --name sharegpt_llama3_8b \
		--block-size 16 32 --size-gb inf 2 5
	$(XC_BIN)/python -m crosscheck.sglang_mamba --export $(XC_SHARE_H) --name sharegpt_nemotron_h_8b \
		--size-gb inf 0.5 1 2 5
	$(XC_BIN)/python -m crosscheck.sglang_mamba --export $(XC_SHARE_H) --name sharegpt_nemotron_h_8b_r02 \
		--size-gb 2 --mamba-ratio 0.2
	$(XC_BIN)/python -m crosscheck.sglang_mamba --export $(XC_SHARE_H) --name sharegpt_nemotron_h_8b \
		--size-gb inf 1 2 5 --strategy extra_buffer
	$(XC_BIN)/python -m crosscheck.vllm_hybrid --export $(XC_SHARE_H) --name sharegpt_nemotron_h_8b \
		--size-gb inf 1 2 5
	$(XC_BIN)/python -m crosscheck.sglang_radix --export $(XC_SWE) --name swebench10_llama3_8b \
		--cache radix --size-gb inf 8
	$(XC_BIN)/python -m crosscheck.sglang_radix --export $(XC_SWE) --name swebench10_llama3_8b \
		--cache radix --size-gb inf 8 --page-size 16
	$(XC_BIN)/python -m crosscheck.vllm_blocks --export $(XC_SWE) --name swebench10_llama3_8b \
		--block-size 16 --size-gb inf 8
	$(XC_BIN)/python -m crosscheck.sglang_mamba --export $(XC_SWE_H) --name swebench10_nemotron_h_8b \
		--size-gb inf 1.5 2 3 5
	$(XC_BIN)/python -m crosscheck.sglang_mamba --export $(XC_SWE_H) --name swebench10_nemotron_h_8b \
		--size-gb inf 1.5 2 3 5 --strategy extra_buffer
	$(XC_BIN)/python -m crosscheck.vllm_hybrid --export $(XC_SWE_H) --name swebench10_nemotron_h_8b \
		--size-gb inf 1 2
	# vLLM's --prefix-match-unit and --prefix-cache-retention-interval (cases *_pmuP, *_rN)
	$(XC_BIN)/python -m crosscheck.vllm_hybrid --export $(XC_SWE_H) --name swebench10_nemotron_h_8b \
		--size-gb 2 inf --prefix-match-unit 16
	$(XC_BIN)/python -m crosscheck.vllm_hybrid --export $(XC_SHARE_H) --name sharegpt_nemotron_h_8b \
		--size-gb 1 --prefix-match-unit 16
	$(XC_BIN)/python -m crosscheck.vllm_hybrid --export $(XC_SHARE_H) --name sharegpt_nemotron_h_8b \
		--size-gb 5 --prefix-match-unit 176
	$(XC_BIN)/python -m crosscheck.vllm_hybrid --export $(XC_SWE_H) --name swebench10_nemotron_h_8b \
		--size-gb 2 --retention-interval 1056
	$(XC_BIN)/python -m crosscheck.vllm_hybrid --export $(XC_SHARE_H) --name sharegpt_nemotron_h_8b \
		--size-gb 1 --retention-interval none
	$(XC_BIN)/python -m crosscheck.sglang_radix --export $(XC_MOON) --name mooncake_llama3_8b \
		--cache radix unified --size-gb inf 30 70 275
	$(XC_BIN)/python -m crosscheck.vllm_blocks --export $(XC_MOON) --name mooncake_llama3_8b \
		--block-size 512 --size-gb inf 30 70 275
	rm -f $(XC_LOAD)/*.csv $(XC_LOAD)/manifest.json
	# vLLM's synchronous loop, then its default AsyncScheduler (cases *_async)
	for async in "" --async-scheduling; do \
	  $(XC_BIN)/python -m crosscheck.vllm_concurrent --export $(XC_SHARE_H) \
		--name sharegpt_nemotron_h_8b --size-gb 1 2 5 --gap 1 4 $$async && \
	  $(XC_BIN)/python -m crosscheck.vllm_concurrent --export $(XC_SHARE_H) \
		--name sharegpt_nemotron_h_8b --size-gb 1 --gap 1 --prefix-match-unit 16 $$async && \
	  $(XC_BIN)/python -m crosscheck.vllm_concurrent --export $(XC_SHARE_H) \
		--name sharegpt_nemotron_h_8b --size-gb 5 --gap 1 --prefix-match-unit 176 $$async && \
	  $(XC_BIN)/python -m crosscheck.vllm_concurrent --export $(XC_SHARE_H) \
		--name sharegpt_nemotron_h_8b --size-gb 1 --gap 1 --retention-interval 1056 $$async && \
	  $(XC_BIN)/python -m crosscheck.vllm_concurrent --export $(XC_SHARE_H) \
		--name sharegpt_nemotron_h_8b --size-gb 1 --gap 1 --retention-interval none $$async && \
	  $(XC_BIN)/python -m crosscheck.vllm_concurrent --export $(XC_SWE_H) \
		--name swebench10_nemotron_h_8b --size-gb 2 5 --gap 2 8 $$async && \
	  $(XC_BIN)/python -m crosscheck.vllm_concurrent --export $(XC_SHARE_H) \
		--name sharegpt_nemotron_h_8b --size-gb 0.6 0.8 --gap 0.5 2 $$async && \
	  $(XC_BIN)/python -m crosscheck.vllm_concurrent --export $(XC_SWE_H) \
		--name swebench10_nemotron_h_8b --size-gb 1.5 --gap 1 4 $$async && \
	  $(XC_BIN)/python -m crosscheck.vllm_concurrent --export $(XC_SHARE) \
		--name sharegpt_llama3_8b --size-gb 1 2 --gap 1 4 $$async && \
	  $(XC_BIN)/python -m crosscheck.vllm_concurrent --export $(XC_SWE) \
		--name swebench10_llama3_8b --size-gb 8 --gap 1 4 $$async && \
	  $(XC_BIN)/python -m crosscheck.vllm_concurrent --export $(XC_SHARE) \
		--name sharegpt_llama3_8b --size-gb 1 --gap 1 4 --block-size 32 $$async && \
	  $(XC_BIN)/python -m crosscheck.vllm_concurrent --export $(XC_SWE) \
		--name swebench10_llama3_8b --size-gb 8 --gap 1 4 --block-size 32 $$async && \
	  $(XC_BIN)/python -m crosscheck.vllm_concurrent --export $(XC_MOON_LOAD) \
		--name mooncake2000_llama3_8b --size-gb 18 --gap 4 12 --block-size 512 $$async && \
	  $(XC_BIN)/python -m crosscheck.vllm_concurrent --export $(XC_MOON_LOAD) \
		--name mooncake2000_llama3_8b --size-gb 20 --gap 1 --block-size 512 $$async && \
	  $(XC_BIN)/python -m crosscheck.vllm_concurrent --export $(XC_MOON_LOAD) \
		--name mooncake2000_llama3_8b --size-gb 60 200 --gap 8 16 --block-size 512 $$async \
		|| exit 1; \
	done
	rm -f $(XC_LOAD_SGL)/*.csv $(XC_LOAD_SGL)/manifest.json
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE) \
		--name sharegpt_llama3_8b --size-gb 0.5 1 --gap 1 4 --mixed
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE) \
		--name sharegpt_llama3_8b --size-gb 0.5 1 --gap 1 4
	for mixed in "" --mixed; do \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE) \
		--name sharegpt_llama3_8b --size-gb 0.5 1 --gap 1 4 --page-size 16 $$mixed && \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SWE) \
		--name swebench10_llama3_8b --size-gb 8 --gap 1 4 --page-size 16 $$mixed \
		|| exit 1; \
	done
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE) \
		--name sharegpt_llama3_8b --size-gb 1 --gap 1 4 --page-size 64
	for mixed in "" --mixed; do \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE) \
		--name sharegpt_llama3_8b --size-gb 0.5 1 --gap 1 4 --max-prefill-tokens 1024 $$mixed \
		|| exit 1; \
	done
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE) \
		--name sharegpt_llama3_8b --size-gb 0.5 1 --gap 1 4 --chunked-prefill-size -1 \
		--max-prefill-tokens 1024
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SWE) \
		--name swebench10_llama3_8b --size-gb 8 --gap 1 4 --chunked-prefill-size -1
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SWE) \
		--name swebench10_llama3_8b --size-gb 8 --gap 1 --chunked-prefill-size -1 --page-size 16
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SWE) \
		--name swebench10_llama3_8b --size-gb 8 --gap 1 --max-prefill-tokens 1024 --page-size 16
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SWE_H) \
		--name swebench10_nemotron_h_8b --size-gb 1.5 --gap 1 --chunked-prefill-size -1
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SWE_H) \
		--name swebench10_nemotron_h_8b --size-gb 1.5 --gap 1 --max-prefill-tokens 1024
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE_H) \
		--name sharegpt_nemotron_h_8b --size-gb 2 5 --gap 1 4
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE_H) \
		--name sharegpt_nemotron_h_8b_r9 --size-gb 1 --mamba-ratio 9 --gap 1 4
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE_H) \
		--name sharegpt_nemotron_h_8b_r9 --size-gb 1 --mamba-ratio 9 --gap 1 4 --mixed
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE_H) \
		--name sharegpt_nemotron_h_8b_r19 --size-gb 1.2 1.5 --mamba-ratio 19 --gap 0.5 1
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE_H) \
		--name sharegpt_nemotron_h_8b_r39 --size-gb 2.5 3 --mamba-ratio 39 --gap 0.5 1 --mixed
	for mixed in "" --mixed; do \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE_H) \
		--name sharegpt_nemotron_h_8b --size-gb 2 5 --gap 1 4 --strategy extra_buffer $$mixed && \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SWE) \
		--name swebench10_llama3_8b --size-gb 8 --gap 1 4 $$mixed && \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SWE) \
		--name swebench10_llama3_8b --size-gb 16 --gap 32 $$mixed && \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SWE_H) \
		--name swebench10_nemotron_h_8b --size-gb 1.5 --gap 1 4 $$mixed && \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SWE_H) \
		--name swebench10_nemotron_h_8b --size-gb 5 --gap 32 $$mixed && \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SWE_H) \
		--name swebench10_nemotron_h_8b_r9 --size-gb 10 --mamba-ratio 9 --gap 1 $$mixed && \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SWE_H) \
		--name swebench10_nemotron_h_8b --size-gb 1.5 5 --gap 1 4 --strategy extra_buffer $$mixed && \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SWE_H) \
		--name swebench10_nemotron_h_8b_r9 --size-gb 10 --mamba-ratio 9 --gap 1 \
		--strategy extra_buffer $$mixed && \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE_H) \
		--name sharegpt_nemotron_h_8b_r19 --size-gb 1.2 1.5 --mamba-ratio 19 --gap 0.5 1 \
		--strategy extra_buffer $$mixed && \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE_H) \
		--name sharegpt_nemotron_h_8b_r39 --size-gb 2.5 3 --mamba-ratio 39 --gap 0.5 1 \
		--strategy extra_buffer $$mixed \
		|| exit 1; \
	done
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE_H) \
		--name sharegpt_nemotron_h_8b_r9 --size-gb 1 --mamba-ratio 9 --gap 1 4 --strategy extra_buffer
	for mixed in "" --mixed; do \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE) \
		--name sharegpt_llama3_8b --size-gb 0.5 1 --gap 1 4 --overlap $$mixed && \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE) \
		--name sharegpt_llama3_8b --size-gb 1 --gap 1 4 --page-size 16 --overlap $$mixed && \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SWE) \
		--name swebench10_llama3_8b --size-gb 8 --gap 1 4 --overlap $$mixed && \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SWE) \
		--name swebench10_llama3_8b --size-gb 8 --gap 1 4 --page-size 16 --overlap $$mixed \
		|| exit 1; \
	done
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE) \
		--name sharegpt_llama3_8b --size-gb 2 8 --gap 1 4 --mixed --overlap
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE) \
		--name sharegpt_llama3_8b --size-gb 1 --gap 1 4 --max-prefill-tokens 1024 --mixed --overlap
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE) \
		--name sharegpt_llama3_8b --size-gb 0.5 --gap 1 4 --chunked-prefill-size -1 \
		--max-prefill-tokens 1024 --overlap
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SWE) \
		--name swebench10_llama3_8b --size-gb 8 --gap 1 --chunked-prefill-size -1 --overlap
	$(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE) \
		--name sharegpt_llama3_8b --size-gb 1 --gap 1 4 --page-size 64 --overlap
	for mixed in "" --mixed; do \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE_H) \
		--name sharegpt_nemotron_h_8b --size-gb 2 5 --gap 1 4 --strategy extra_buffer \
		--overlap $$mixed && \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SHARE_H) \
		--name sharegpt_nemotron_h_8b_r19 --size-gb 1.2 1.5 --mamba-ratio 19 --gap 0.5 1 \
		--strategy extra_buffer --overlap $$mixed && \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SWE_H) \
		--name swebench10_nemotron_h_8b --size-gb 1.5 5 --gap 1 4 --strategy extra_buffer \
		--overlap $$mixed && \
	  $(XC_BIN)/python -m crosscheck.sglang_concurrent --export $(XC_SWE_H) \
		--name swebench10_nemotron_h_8b_r9 --size-gb 10 --mamba-ratio 9 --gap 1 \
		--strategy extra_buffer --overlap $$mixed \
		|| exit 1; \
	done
