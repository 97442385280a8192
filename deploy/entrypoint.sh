#!/bin/sh
# Container entrypoint: sandboxd as PID 1. It reaps orphaned processes and handles SIGTERM from
# `docker stop` itself (drain, then exit 0), so no tini/dumb-init is needed; `exec` matters, so
# that the signal reaches sandboxd and not this shell.
#
# The token is read from a file (a Docker/Kubernetes secret mount) by sandboxd itself, so it
# never appears in the environment of the container or in `ps`. Without the file sandboxd starts
# open and takes its token from POST /init (E2B's flow).
#
# Dockerfile:
#   COPY target/x86_64-unknown-linux-musl/release/sandboxd /usr/local/bin/sandboxd
#   COPY deploy/entrypoint.sh /entrypoint.sh
#   ENTRYPOINT ["/entrypoint.sh"]
#   STOPSIGNAL SIGTERM
#   HEALTHCHECK --interval=10s --timeout=3s --start-period=2s --retries=3 \
#     CMD ["/usr/local/bin/sandboxd", "--healthcheck"]
# (`--healthcheck` probes the address from SANDBOXD_LISTEN, a wildcard becoming 127.0.0.1; the
# image needs no curl. `docker stop -t` must exceed the drain timeout, 10 s by default.)
set -eu
# SANDBOXD_ACCESS_TOKEN_FILE, when set, is read by sandboxd itself (and a missing file is then a
# startup error, never an open daemon). Otherwise the conventional secret path is used if present.
default_token_file=/run/secrets/sandboxd_token
if [ -z "${SANDBOXD_ACCESS_TOKEN_FILE:-}" ] && [ -r "$default_token_file" ]; then
    exec /usr/local/bin/sandboxd --access-token-file "$default_token_file" "$@"
fi
exec /usr/local/bin/sandboxd "$@"
