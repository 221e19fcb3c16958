#!/usr/bin/env bash
# Runs every test of Drover: formatting, lints, unit and property tests, and the integration
# tests on a real fleet of sshd hosts on loopback addresses.
# Installs what the tests need when it is missing (Debian's openssh-server, needs root; moto).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
# a real load balancer in front of a pool, for tests/it/haproxy.rs
[ -x /usr/sbin/haproxy ] || missing+=(haproxy)
command -v ssh >/dev/null || missing+=(openssh-client)
command -v python3 >/dev/null || missing+=(python3)
command -v unshare >/dev/null || missing+=(util-linux)
# a login shell that is not /bin/sh, for tests/it/login_shell.rs
[ -x /usr/bin/zsh ] || missing+=(zsh)
# the shared store: etcd's client is built with the `etcd` feature, whose build script
# compiles etcd's protos with protoc; tests/it/store.rs runs a real etcd (and makes its TLS CA
# with openssl)
command -v protoc >/dev/null || missing+=(protobuf-compiler)
command -v etcd >/dev/null || missing+=(etcd-server)
# etcdctl, to set up etcd's users and roles for the `auth` test
command -v etcdctl >/dev/null || missing+=(etcd-client)
command -v openssl >/dev/null || missing+=(openssl)
# pip, for moto below (only when moto is missing too)
python3 -c 'import moto.server' 2>/dev/null || python3 -m pip --version >/dev/null 2>&1 \
    || missing+=(python3-pip)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "tests/run.sh: needs ${missing[*]}; run as root to install them" >&2
        exit 1
    fi
    echo "tests/run.sh: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# moto's EC2 server, for tests/it/ec2.rs (from PyPI; Debian's own python3 wants
# --break-system-packages for that)
if ! python3 -c 'import moto.server' 2>/dev/null; then
    echo "tests/run.sh: installing moto[server]" >&2
    python3 -m pip install --quiet 'moto[server]' 2>/dev/null \
        || python3 -m pip install --quiet --break-system-packages 'moto[server]'
fi

cargo fmt --check

# Lints (clippy, warnings denied) on every target with the etcd store, and on the default build
# (no etcd: what the README's demo builds).
target_dir=$(cargo metadata --format-version 1 --no-deps \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
if [ -d "$target_dir/debug" ]; then
    # A target directory that has builds in it (a developer's): `cargo clippy`, whose check
    # builds are there already, lints what changed the cheapest way.
    cargo clippy --all-targets --quiet --features etcd -- -D warnings
    cargo clippy --lib --quiet -- -D warnings
else
    # A fresh one (CI's clone): clippy's driver compiles drover's own crates, linting them as
    # `cargo clippy` would (with `-D warnings`), in a build of every target that uses the
    # dependencies' real builds, the ones the tests then link. `cargo clippy` would first make a
    # check build of every dependency, used by nothing else (287 s of a CI run;
    # book/src/testing.md).
    driver=$(command -v clippy-driver) || {
        echo "tests/run.sh: clippy-driver not found (rustup component add clippy)" >&2
        exit 1
    }
    # Exported: the tests below then run the driver's builds of drover's crates instead of
    # compiling them again with rustc (the same code; cargo keeps the two builds apart). .ci/run
    # sets the same two values for the builds of its later stages.
    export RUSTC_WORKSPACE_WRAPPER="$driver"
    export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
    cargo test --quiet --features etcd --all-targets --no-run
    cargo build --quiet --lib
fi

# Every test, with the etcd store (tests/it/store.rs and the store's unit tests need it): the
# library's unit tests, then the one integration-test program (tests/it/, a module per feature),
# its tests two at a time (cargo's default on two cores). Three programs at a time took as long
# (225 s against 232 s, 2026-11-26), their CPU grown by three quarters under contention (their
# fleets' sshd, moto, etcd), and a unit test's timing on the fake transport broke.
cargo test --quiet --features etcd

# Without the ec2 backend or the etcd store: a platform naming either is still checked, and
# using it says how to get a build that has it (src/inventory/mod.rs, src/state/store/).
cargo test --quiet --no-default-features --lib -- inventory state::store
