# sandboxd: build, run, test, bench. Every tool a target needs is installed here or by scripts/.
TARGET  := x86_64-unknown-linux-musl
BIN     := target/$(TARGET)/release/sandboxd
ADDR    ?= 127.0.0.1:49983
CARGO   ?= cargo

.PHONY: build run test unit integration lint bench soak fuzz clean

build: $(BIN)

$(BIN): FORCE
	@rustup target list --installed 2>/dev/null | grep -qx $(TARGET) || rustup target add $(TARGET)
	$(CARGO) build --release --locked --target $(TARGET)
	@ls -l $(BIN) | awk '{print "built $(BIN): " $$5 " bytes"}'

FORCE:

# Starts the daemon in the foreground with a throwaway token (printed) and the real /etc/passwd.
run: build
	@token=$${SANDBOXD_ACCESS_TOKEN:-$$(head -c 18 /dev/urandom | base64 | tr '+/' '-_')}; \
	echo "sandboxd on http://$(ADDR)  token: $$token"; \
	echo "  curl -i http://$(ADDR)/health"; \
	echo "  curl -s -H 'X-Access-Token: $$token' http://$(ADDR)/envs"; \
	SANDBOXD_ACCESS_TOKEN=$$token exec $(BIN) --listen $(ADDR)

test: lint unit integration

lint:
	@rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
	@rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
	$(CARGO) fmt --check
	$(CARGO) clippy --locked --all-targets -- -D warnings

unit:
	$(CARGO) test --locked --lib --bins

integration:
	$(CARGO) test --locked --tests

bench: build
	@for script in scripts/bench/*; do [ ! -x "$$script" ] || "$$script" || exit 1; done

clean:
	$(CARGO) clean
