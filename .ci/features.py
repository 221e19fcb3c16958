#!/usr/bin/env python3
"""Checks that the builds CI makes share their dependencies' builds (Cargo.toml, "Feature
unification"): every crate the default build (`cargo build`, the README's demo) or the build
without default features (`cargo test --no-default-features --lib`) compiles must be compiled
with features that `cargo test --features etcd` also compiles it with. A crate whose features
differ is compiled again, with every crate above it (serde's or tokio's: minutes on two cores).

Prints each such crate and the features to name in Cargo.toml's feature-unification list, and
exits 1; prints one line and exits 0 when there is none. Reads `cargo tree`; builds nothing.
`cargo tree` lists a crate built for build scripts and proc macros like one built for the
target: a feature set that matches only the tests' build-script copy passes unnoticed.
"""
import collections
import subprocess
import sys


def features(args):
    """Package -> the feature sets it is built with (for the target and for build scripts and
    proc macros, which cargo tree lists alike)."""
    out = subprocess.run(
        ["cargo", "tree", "--prefix", "none", "-f", "{p}|{f}", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = collections.defaultdict(set)
    for line in out.splitlines():
        if "|" not in line:
            continue
        package, feats = line.split("|", 1)
        package = package.split(" (")[0].strip()
        found[package].add(feats.replace("(*)", "").strip())
    return found


def main():
    tests = features(["-e", "features", "--features", "etcd"])
    builds = {
        "cargo build (default features)": features(["-e", "features,no-dev"]),
        "cargo test --no-default-features": features(["-e", "features", "--no-default-features"]),
    }
    problems = []
    for name, build in builds.items():
        for package, sets in sorted(build.items()):
            if package.startswith("drover ") or package not in tests:
                continue
            for feats in sets - tests[package]:
                wanted = " or ".join(repr(s) for s in sorted(tests[package]))
                problems.append(f"{name}: {package} with [{feats}], the tests build it with {wanted}")
    if problems:
        print(".ci/features.py: these crates would be compiled twice; name them with the tests'", file=sys.stderr)
        print("features in Cargo.toml's feature-unification list:", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return 1
    print(".ci/features.py: the default and no-default-features builds reuse the tests' dependencies")
    return 0


if __name__ == "__main__":
    sys.exit(main())
