# shellcheck shell=bash
# Shared helpers for the benchmark scripts in scripts/bench/. Not a benchmark itself (not
# executable, so `make bench` skips it). Source it from a script that runs with `set -euo pipefail`:
#
#   . "$(dirname "$0")/lib.sh"
#   need_pkg nginx wrk            # apt-get install only what is missing
#   start_sandboxd                # sets SANDBOXD_PID, SANDBOXD_PORT, SANDBOXD_TOKEN
#   start_nginx 'location = /health { return 204; }'   # sets NGINX_PID, NGINX_PORT
#   median 3 1 2                  # prints 2
#   machine_line                  # one line: CPU model, cores, kernel, memory, load
#
# Everything it starts is stopped, and its temp dir ($BENCH_TMP) removed, by an EXIT trap.
# A script that needs its own cleanup appends a command to BENCH_CLEANUP instead of replacing
# the trap.

BENCH_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SANDBOXD_BIN=${SANDBOXD_BIN:-$BENCH_ROOT/target/x86_64-unknown-linux-musl/release/sandboxd}
BENCH_TMP=$(mktemp -d "${TMPDIR:-/tmp}/sandboxd-bench.XXXXXX")
# Every daemon a script starts: no cgroups made in the machine's hierarchy (the default is its
# root, /sys/fs/cgroup, as envd's) and no /fsfreeze of a real filesystem (the default is /).
# A script that means either passes the flag, which wins.
export SANDBOXD_PROCESS_CGROUPS=${SANDBOXD_PROCESS_CGROUPS:-off}
export SANDBOXD_FSFREEZE_PATH=${SANDBOXD_FSFREEZE_PATH:-$BENCH_TMP/no-fsfreeze}
BENCH_PIDS=()
BENCH_CLEANUP=()

bench_cleanup() {
    local pid cmd
    for cmd in "${BENCH_CLEANUP[@]}"; do eval "$cmd" || true; done
    for pid in "${BENCH_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${BENCH_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$BENCH_TMP"
}
trap bench_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

PATH=$PATH:/usr/sbin:/sbin   # nginx lives in /usr/sbin

die() { echo "${0##*/}: $*" >&2; exit 1; }
note() { echo "# $*" >&2; }

# need_pkg NAME... : each NAME is a command that the Debian package of the same name provides,
# or COMMAND=PACKAGE when they differ (e.g. `cc=gcc`). Installs only the missing ones, as root.
# (Debian's nginx postinst may also start the system nginx on :80 where an init runs; the
# benchmarks use their own nginx instance and never touch that one.)
need_pkg() {
    local spec cmd pkg missing=()
    for spec in "$@"; do
        cmd=${spec%%=*}; pkg=${spec#*=}
        command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "missing ${missing[*]}; run as root or install them"
    note "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# The release binary; built with `make build` when missing (make bench has built it already).
need_sandboxd() {
    [ -x "$SANDBOXD_BIN" ] || make -C "$BENCH_ROOT" build >&2 || die "cannot build $SANDBOXD_BIN"
}

# http_status PORT PATH : the status code of GET PATH on 127.0.0.1:PORT, in pure bash (no curl);
# empty when nothing answers.
http_status() {
    local line
    { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 0
    printf 'GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$2" >&3
    read -r -t 2 line <&3 || true
    exec 3<&-
    line=${line#* }; echo "${line%% *}"
}

# free_port : a TCP port on 127.0.0.1 nobody listens on, below the ephemeral range so that
# wrk's own client ports never collide with it. The callers retry if it is taken meanwhile.
free_port() {
    local port
    while :; do
        port=$((20000 + RANDOM % 12000))
        { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null && { exec 3<&-; continue; }
        echo "$port"; return
    done
}

# wait_ready PID PORT STATUS WHAT : polls GET /health until its status matches the glob STATUS;
# returns 1 if the process exits first (for the callers' retry), dies after 10 s.
wait_ready() {
    local i
    for ((i = 0; i < 1000; i++)); do
        kill -0 "$1" 2>/dev/null || return 1
        # shellcheck disable=SC2053 # $3 is a glob on purpose
        [[ $(http_status "$2" /health) == $3 ]] && return 0
        sleep 0.01
    done
    die "$4 on port $2 not ready after 10 s"
}

# start_sandboxd [LOG] [ARGS...] : starts sandboxd on a free 127.0.0.1 port with a fresh random
# token (in the environment, as in production) and waits for /health 204. Its stderr (one line
# per request) goes to LOG, a new file in BENCH_TMP by default: a daemon logs to a file (or a
# journal) in production, and a benchmark pays what production pays.
# Sets SANDBOXD_PID, SANDBOXD_PORT, SANDBOXD_TOKEN. --drain-timeout 2 keeps the cleanup short.
start_sandboxd() {
    local log=${1:-$(mktemp "$BENCH_TMP/sandboxd.XXXXXX.log")}
    shift || true
    need_sandboxd
    SANDBOXD_TOKEN=$(head -c 18 /dev/urandom | base64 | tr '+/' '-_')
    for _ in 1 2 3 4 5; do
        SANDBOXD_PORT=$(free_port)
        SANDBOXD_ACCESS_TOKEN=$SANDBOXD_TOKEN "$SANDBOXD_BIN" --listen "127.0.0.1:$SANDBOXD_PORT" \
            --drain-timeout 2 "$@" 2>"$log" &
        SANDBOXD_PID=$!
        BENCH_PIDS+=("$SANDBOXD_PID")
        wait_ready "$SANDBOXD_PID" "$SANDBOXD_PORT" 204 sandboxd && return 0
        wait "$SANDBOXD_PID" 2>/dev/null || true
    done
    die "sandboxd did not start (see $log)"
}

# stop PID : SIGTERM and wait (sandboxd drains, nginx does a fast shutdown).
stop() { kill -TERM "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# start_nginx 'SERVER BLOCK BODY' [ACCESS_LOG] : nginx in the foreground (`daemon off`, so $! is
# the master and the EXIT trap can stop it) with prefix, temp dirs, pid file and error log in a
# temp dir of its own (several may run at once), listening on a free 127.0.0.1 port. ACCESS_LOG:
# `off` (no log at all), or the file each request's line goes to (default /dev/null). Sets
# NGINX_PID, NGINX_PORT, NGINX_DIR.
#
# worker_processes auto: one worker per CPU, nginx's own recommendation and what a production
# config uses, so sandboxd is compared with nginx as its documentation tunes it on whatever
# machine runs the benchmark (2 workers on a 2-core machine). keepalive_requests is raised so a
# keep-alive connection is never closed by nginx during a run (sandboxd does not close them
# either), and access_log goes to /dev/null unless told (a script comparing CPU per request
# names a file, as sandboxd's log goes to one, or `off`, nginx's cheapest).
start_nginx() {
    local dir access_log
    dir=$(mktemp -d "$BENCH_TMP/nginx.XXXXXX")
    NGINX_DIR=$dir
    access_log=${2:-/dev/null}
    need_pkg nginx
    mkdir -p "$dir/logs" "$dir/tmp"
    for _ in 1 2 3 4 5; do
        NGINX_PORT=$(free_port)
        cat >"$dir/nginx.conf" <<EOF
worker_processes auto;
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log $access_log;
    keepalive_requests 1000000;
    client_body_temp_path $dir/tmp/body;
    proxy_temp_path $dir/tmp/proxy;
    fastcgi_temp_path $dir/tmp/fastcgi;
    uwsgi_temp_path $dir/tmp/uwsgi;
    scgi_temp_path $dir/tmp/scgi;
    server {
        listen 127.0.0.1:$NGINX_PORT;
        $1
    }
}
EOF
        nginx -p "$dir" -e "$dir/logs/error.log" -c "$dir/nginx.conf" -g 'daemon off;' 2>>"$dir/logs/stderr.log" &
        NGINX_PID=$!
        BENCH_PIDS+=("$NGINX_PID")
        # Ready once it answers at all: the caller's block decides what /health returns.
        wait_ready "$NGINX_PID" "$NGINX_PORT" '[1-5][0-9][0-9]' nginx && return 0
        wait "$NGINX_PID" 2>/dev/null || true
    done
    cat "$dir/logs/error.log" "$dir/logs/stderr.log" >&2 2>/dev/null || true
    die "nginx did not start"
}

# median NUMBER... (or one number per line on stdin when no arguments): the median; the mean
# of the two middle values for an even count.
median() {
    { if [ $# -gt 0 ]; then printf '%s\n' "$@"; else cat; fi; } | sort -g | awk '
        { v[NR] = $1 }
        END { if (NR == 0) exit 1
              if (NR % 2) print v[(NR + 1) / 2]
              else printf "%.10g\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# machine_line : CPU model, online cores, kernel, memory and load average, on one line.
machine_line() {
    local cpu mem
    cpu=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
    mem=$(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
    echo "machine: ${cpu:-unknown CPU}, $(nproc) cores, Linux $(uname -r), $mem RAM, load $(cut -d' ' -f1-3 /proc/loadavg)"
}

# bench_row METRIC SANDBOXD PEER PEER_VALUE RATIO TARGET: one row of `make bench`'s summary table,
# appended to $BENCH_RESULTS when set (TARGET like ">=1.0" or "<=2.0" applies to RATIO, or to
# SANDBOXD when PEER is "-"). Without BENCH_RESULTS, a no-op.
bench_row() {
    [ -z "${BENCH_RESULTS:-}" ] || printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$BENCH_RESULTS"
}
