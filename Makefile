# sandboxd: build, run, test, bench. Every tool a target needs is installed here or by scripts/.
TARGET  := x86_64-unknown-linux-musl
BIN     := target/$(TARGET)/release/sandboxd
ADDR    ?= 127.0.0.1:49983
CARGO   ?= cargo
# Every daemon a target starts (test, bench, soak, sdk-test) makes no cgroups in the machine's
# hierarchy and freezes no real filesystem unless told: the defaults are /sys/fs/cgroup (envd's)
# and /. A flag, or these variables set by the caller, win. (`run` makes a
# cgroup and a filesystem of its own: scripts/run-sandbox.)
export SANDBOXD_PROCESS_CGROUPS ?= off
export SANDBOXD_FSFREEZE_PATH ?= /nonexistent/sandboxd-no-fsfreeze

.PHONY: build run test unit integration lint bench fuzz clean sdk-test vm vm-test

build: $(BIN)

# The release binary: std rebuilt with the daemon's own profile (size first, panic=abort) and
# without its backtrace printer (gimli, addr2line, libunwind: 260 KB of a 1.6 MB binary that a
# panic=abort build never unwinds with); a panic still prints its message. -Z build-std needs
# the toolchain's source (rust-src) and is unstable, hence RUSTC_BOOTSTRAP (docs/design.md,
# "Binary size").
$(BIN): FORCE
	@rustup target list --installed 2>/dev/null | grep -qx $(TARGET) || rustup target add $(TARGET)
	@rustup component list --installed 2>/dev/null | grep -q '^rust-src' || rustup component add rust-src
	RUSTC_BOOTSTRAP=1 $(CARGO) build --release --locked --target $(TARGET) \
	  -Z build-std=std,panic_abort -Z build-std-features=
	@ls -l $(BIN) | awk '{print "built $(BIN): " $$5 " bytes"}'

FORCE:

# Starts the daemon in the foreground in a sandbox of its own under target/run (users root and
# user, homes, a freezable filesystem and process cgroups where the machine allows), in which
# every README example works; it prints what to `source` in another terminal. RUN_DIR, ADDR.
RUN_DIR ?= target/run
run: build
	@scripts/run-sandbox $(BIN) $(RUN_DIR) $(ADDR)

test: lint unit integration

lint:
	@rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
	@rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
	$(CARGO) fmt --all --check
	$(CARGO) clippy --locked --workspace --all-targets --features fuzzing,vm-tests -- -D warnings

unit:
	$(CARGO) test --locked --workspace --lib --bins

integration:
	$(CARGO) test --locked --workspace --test '*'

# Every benchmark in scripts/bench/, then one table of their rows (target/bench/results.tsv).
BENCH_RESULTS := $(CURDIR)/target/bench/results.tsv
bench: build
	@mkdir -p $(dir $(BENCH_RESULTS)) && : > $(BENCH_RESULTS)
	@for script in scripts/bench/*; do \
	  if [ -f "$$script" ] && [ -x "$$script" ]; then echo "== $$script"; BENCH_RESULTS=$(BENCH_RESULTS) "$$script" || exit 1; fi; \
	done
	@scripts/bench-table $(BENCH_RESULTS) | tee $(dir $(BENCH_RESULTS))summary.md

# Fuzzing with cargo-fuzz (libFuzzer). Stable Rust: RUSTC_BOOTSTRAP lets cargo-fuzz use the
# sanitizer flags. FUZZ_SECONDS per target (default 60); findings land in fuzz/artifacts/.
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := connection head chunked query range_and_conditions json_bodies proc_and_cgroup multipart gzip connect_envelope connect_json connect_proto init_system_files platform_inputs tar
fuzz:
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	@for target in $(FUZZ_TARGETS); do \
	  echo "== fuzz $$target for $(FUZZ_SECONDS)s"; \
	  RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run $$target -- -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 || exit 1; \
	done

clean:
	$(CARGO) clean

# Soak: the long ignored tests (kill -9 rounds), schemathesis against docs/openapi.yaml on the
# running daemon, and wrk load (DURATION, default 30s). Minutes, not seconds; not part of `test`.
.PHONY: soak
soak: build
	$(CARGO) test --release --locked -- --ignored
	scripts/soak/schemathesis
	scripts/soak/load

# The published e2b SDKs (Python from PyPI into target/sdk-test/venv; JS from npm when node is
# installed) against a fresh daemon: real files.write/read and signed-URL calls, PASS/FAIL each.
# Needs the registries; not part of `test`.
sdk-test: build
	SANDBOXD_BIN=$(CURDIR)/$(BIN) scripts/sdk-test

# sandboxd in QEMU guests (docs/vm.md): Debian's stock cloud kernel, the release binary as
# /usr/bin/envd with no flags, the guest at 169.254.0.21 on a restricted user network, a fake
# metadata service on the host's loopback. vm/images installs QEMU and the rest from Debian and
# builds the images under target/vm/ (again only when an input changed). VM_TESTS filters the
# scenarios (e.g. VM_TESTS=pause); one guest at a time, under KVM when it works, else TCG. The
# SDK scenario (VM_TESTS=sdk) runs scripts/sdk-test against the template guest, installing the
# SDKs into target/sdk-test/ first when missing, as sdk-test does (so it needs the registries).
VM_TESTS ?=
vm-test: build
	vm/images minimal template
	@: > target/vm/figures.tsv
	$(CARGO) test --locked --features vm-tests --test vm -- --test-threads=1 $(VM_TESTS)
	@echo "== figures (target/vm/figures.tsv)"; column -t -s '	' target/vm/figures.tsv 2>/dev/null || cat target/vm/figures.tsv

# Boots one minimal guest and prints curl lines for it; ends when the guest powers off (or ^C).
vm: build
	vm/images minimal
	$(CARGO) test --locked --features vm-tests --test vm -- --ignored --nocapture --exact support::interactive
