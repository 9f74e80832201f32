# The two commands: `make run` starts a node, `make test` runs the tests.
# Both install what a fresh machine lacks first.

CARGO_TARGET_DIR ?= $(HOME)/.cache/drover-target
DROVER_TOOLS ?= $(HOME)/.cache/drover-tools/bin
export DROVER_TOOLS
export CARGO_TARGET_DIR

.PHONY: run test setup fmt lint jepsen jepsen-long

# The fault-injection suite, short form (under 10 minutes): every nemesis for
# 15 s, then all combined over TLS with tokens. Needs root (network namespaces,
# nftables, tc, FUSE).
JEPSEN_TIME ?= 15

setup:
	@./scripts/setup.sh

run: setup
	cargo run --release --bin drover -- serve --ojs-addr 0.0.0.0:8080

jepsen: setup
	cargo build --workspace --bins
	$(CARGO_TARGET_DIR)/debug/drover-jepsen suite --time $(JEPSEN_TIME) --drain 90 \
		--drover $(CARGO_TARGET_DIR)/debug/drover --out jepsen/runs

# The long form, on release builds: every nemesis alone for 5 minutes on 3
# nodes, then all combined for 30 minutes on 5 nodes. One summary line per run
# goes to jepsen/runs/long-<time>.txt (docs/reliability.md has the figures).
jepsen-long: setup
	cargo build --release --workspace --bins
	mkdir -p jepsen/runs
	log=jepsen/runs/long-$$(date +%s).txt; \
	$(CARGO_TARGET_DIR)/release/drover-jepsen suite --time 300 --combined-time 1800 --combined-nodes 5 \
		--producers 48 --worker-sets 12 --drain 300 --skip-secure \
		--drover $(CARGO_TARGET_DIR)/release/drover --out jepsen/runs >$$log 2>&1; \
	status=$$?; cat $$log; exit $$status

test: setup
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory jepsen; \
	else echo "skipping the jepsen suite: it needs root for network namespaces"; fi
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
