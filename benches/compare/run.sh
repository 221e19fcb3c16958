#!/usr/bin/env bash
# Drover against Ansible and pyinfra on one machine: a loopback fleet of sshd hosts, the same
# four shell steps per host in every tool, medians and ratios in a table.
#
#   bash benches/compare/run.sh [--hosts 50,200] [--runs 3] [--tools drover,ansible,pyinfra,ssh]
#                               [--out DIR] [--no-memory] [--rtt MS] [--kex default|curve25519]
#   bash benches/compare/run.sh --smoke     # 10 hosts, 1 run, debug build (CI)
#   bash benches/compare/run.sh --workload tiers [--hosts 200] [--runs 3] [--rtt 30]
#                               # three tiers, db → api → web (tiers.rs); --smoke: 20 hosts
#   bash benches/compare/run.sh --workload artifact [--hosts 50] [--size-mb 100]
#                               # one large file against scp (artifact.rs); --smoke: 5 hosts, 8 MB
#
# Needs root on Linux with openssh-server, openssh-client, util-linux, curl, python3 (with
# venv), protoc and etcd (the store modes), and cc (the tiers' hosts' server); installs the missing ones with apt-get. Makes
# benches/compare/.venv (ansible-core and pyinfra from PyPI, versions in requirements.txt),
# then runs benches/compare/main.rs: the
# release build through `cargo bench`, or the debug build with --smoke. Results go to
# benches/compare/out/ (results.md or smoke.md, runs.csv, logs/). See book/src/performance.md and book/src/appendix-measurements.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=benches/compare

if [ "$(id -u)" != 0 ]; then
    echo "$here/run.sh: the loopback fleet needs root" >&2
    exit 1
fi
missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v ssh >/dev/null || missing+=(openssh-client)
command -v unshare >/dev/null || missing+=(util-linux)
command -v curl >/dev/null || missing+=(curl)
[ -x /usr/bin/python3 ] || missing+=(python3) # on the hosts: the HTTP server, Ansible's modules
python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv) # the controller's virtualenv
# the store modes: `deploy` built with etcd (its build needs protoc) and a real etcd
command -v protoc >/dev/null || missing+=(protobuf-compiler)
command -v etcd >/dev/null || missing+=(etcd-server)
command -v cc >/dev/null || missing+=(gcc) # the three-tier workload's server, built on the spot
if [ ${#missing[@]} -gt 0 ]; then
    echo "$here/run.sh: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

smoke=false
for arg in "$@"; do [ "$arg" = --smoke ] && smoke=true; done

# The virtualenv, made once and refreshed when requirements.txt changes.
venv=$here/.venv
if ! cmp -s "$here/requirements.txt" "$venv/requirements.txt" 2>/dev/null; then
    echo "$here/run.sh: installing ansible-core and pyinfra into $venv" >&2
    if python3 -m venv --clear "$venv" &&
        "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"; then
        cp "$here/requirements.txt" "$venv/requirements.txt"
    elif $smoke; then
        # The smoke test still runs Drover, the ssh floor and the harness itself.
        echo "$here/run.sh: WARNING: could not install ansible-core and pyinfra; smoke-testing without them" >&2
        rm -rf "$venv"
    else
        echo "$here/run.sh: could not install ansible-core and pyinfra" >&2
        exit 1
    fi
fi

if $smoke; then
    # The debug build: the smoke test checks the harness, not the speed.
    exec cargo test --quiet --features etcd --bench compare -- "$@"
else
    exec cargo bench --quiet --features etcd --bench compare -- --run "$@"
fi
