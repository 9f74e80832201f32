# The two commands: `make run` starts a node, `make test` runs the tests.
# Both install what a fresh machine lacks first.

CARGO_TARGET_DIR ?= $(HOME)/.cache/drover-target
DROVER_TOOLS ?= $(HOME)/.cache/drover-tools/bin
export DROVER_TOOLS
export CARGO_TARGET_DIR

.PHONY: run test setup fmt lint

setup:
	@./scripts/setup.sh

run: setup
	cargo run --release --bin drover -- serve

test: setup
	@if cargo nextest --version >/dev/null 2>&1; then \
		cargo nextest run --workspace --no-fail-fast; \
	else \
		cargo test --workspace --no-fail-fast; \
	fi

fmt:
	cargo fmt --all

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
