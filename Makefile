# The two commands: `make run` starts a node, `make test` runs the tests.
# Both install what a fresh machine lacks first.

CARGO_TARGET_DIR ?= $(HOME)/.cache/drover-target
DROVER_TOOLS ?= $(HOME)/.cache/drover-tools/bin
export DROVER_TOOLS
export CARGO_TARGET_DIR

# RocksDB's C++ is most of a cold build, and a check (clippy), a test build and
# a release build each compile it. With ccache there (scripts/setup.sh installs
# it) the compiler goes through it, and Cargo.toml gives RocksDB the same flags
# in every profile, so the C++ is compiled once and served from the cache after.
CCACHE := $(shell command -v ccache 2>/dev/null)
ifneq ($(CCACHE),)
ifeq ($(origin CC),default)
export CC := ccache gcc
endif
ifeq ($(origin CXX),default)
export CXX := ccache g++
endif
export CCACHE_DIR ?= $(HOME)/.cache/ccache
export CCACHE_MAXSIZE ?= 5G
endif

.PHONY: run test setup fmt lint jepsen jepsen-long

# The fault-injection suite, short form: every nemesis for 15 s (faults from
# start to end), the bad links on two regions, all combined over TLS with
# tokens until each nemesis fired, then the negative controls (a bug planted
# in each, which the checker must find). Needs root (network namespaces,
# nftables, tc, FUSE). Each run's summary line says what it found and which
# faults it injected.
JEPSEN_TIME ?= 15
JEPSEN_CONTROL_TIME ?= 12

setup:
	@./scripts/setup.sh

# `make run` builds what `make test` builds (the workspace's binaries in the
# dev profile, RocksDB optimised as in every profile), so after either the
# other compiles nothing of the dependencies again. It listens on loopback
# only, without tokens: a node to try, not to expose (docs/operations.md has
# the flags of a real one). RUN_FLAGS adds to them.
RUN_FLAGS ?=
run: setup
	cargo build --workspace --bins
	$(CARGO_TARGET_DIR)/debug/drover serve --grpc-addr 127.0.0.1:26500 --admin-addr 127.0.0.1:9600 \
		--ojs-addr 127.0.0.1:8080 $(RUN_FLAGS)

jepsen: setup
	cargo build --workspace --bins
	$(CARGO_TARGET_DIR)/debug/drover-jepsen suite --time $(JEPSEN_TIME) --control-time $(JEPSEN_CONTROL_TIME) \
		--drain 90 --drover $(CARGO_TARGET_DIR)/debug/drover --out jepsen/runs

# The long form, on release builds: every nemesis alone for 5 minutes on 3
# nodes, then all combined for 30 minutes on 5 nodes. One summary line per run
# goes to jepsen/runs/long-<time>.txt (docs/reliability.md has the figures).
jepsen-long: setup
	cargo build --release --workspace --bins
	mkdir -p jepsen/runs
	log=jepsen/runs/long-$$(date +%s).txt; \
	$(CARGO_TARGET_DIR)/release/drover-jepsen suite --time 300 --combined-time 1800 --combined-nodes 5 \
		--producers 48 --worker-sets 12 --drain 300 --skip-secure --skip-controls \
		--drover $(CARGO_TARGET_DIR)/release/drover --out jepsen/runs >$$log 2>&1; \
	status=$$?; cat $$log; exit $$status

# Both halves run whatever the other did, and the target fails if either
# failed. nextest runs its `ci` profile, which retries nothing
# (.config/nextest.toml). Without root the fault suite cannot run: that fails,
# loudly.
test: setup
	@status=0; \
	if [ "$$(id -u)" = 0 ]; then \
		$(MAKE) --no-print-directory jepsen || { echo "make test: the fault suite FAILED" >&2; status=1; }; \
	else \
		echo "make test: the fault suite needs root (network namespaces, nftables, tc, FUSE): NOT RUN, and that fails" >&2; \
		status=1; \
	fi; \
	if cargo nextest --version >/dev/null 2>&1; then \
		cargo nextest run --workspace --no-fail-fast --profile ci || { echo "make test: nextest FAILED" >&2; status=1; }; \
	else \
		cargo test --workspace --no-fail-fast || { echo "make test: cargo test FAILED" >&2; status=1; }; \
	fi; \
	exit $$status

fmt:
	cargo fmt --all

lint: setup
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
