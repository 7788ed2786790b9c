# Engram: `make run` serves the portal and API on http://127.0.0.1:3000; `make test` runs everything.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
# One target directory outside the clone, so a fresh clone (CI) reuses earlier builds.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/engram/target
# apalis-postgres's query macros must not check against a live database while compiling.
export SQLX_OFFLINE := true
unexport DATABASE_URL

.PHONY: run test setup build site lint bench-ingest bench-search bench-locomo bench-classifier bench-embed bench-models bench-proxy bench-stats bench-load clean-db

run: setup build
	ENGRAM_SITE_ROOT=$(CARGO_TARGET_DIR)/site $(CARGO_TARGET_DIR)/release/engram serve

test:
	bash scripts/test.sh

setup:
	bash scripts/setup.sh

build:
	cargo build --release -p server
	bash scripts/build-site.sh

site:
	bash scripts/build-site.sh

lint:
	cargo fmt --all -- --check
	cargo clippy -p server -p kernels --all-targets -- -D warnings
	cargo clippy -p frontend --target wasm32-unknown-unknown -- -D warnings

bench-classifier: setup
	cargo run --release -p server -- bench classifier

bench-ingest: setup
	cargo run --release -p server -- bench ingest

bench-search: setup
	cargo run --release -p server -- bench search

bench-models: setup
	cargo run --release -p server -- bench models

bench-proxy: setup
	cargo run --release -p server -- bench proxy

bench-stats: setup
	cargo run --release -p server -- bench stats

bench-load: setup site
	cargo run --release -p server -- bench load

bench-embed: setup
	cargo run --release -p server -- bench embed

bench-locomo: setup
	cargo run --release -p server -- bench locomo --data ../shared/data/locomo/locomo_dev5.json
