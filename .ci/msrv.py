#!/usr/bin/env python3
"""Checks the declared minimum Rust version (`rust-version` in Cargo.toml) against the
dependency graph: it must equal the highest `rust-version` that a dependency the crate builds
with declares, so it is the lowest version the crate can build with, neither promising a
toolchain a dependency refuses nor asking for a newer one than needed. Only one toolchain is
on the build machines, so the language side is left to clippy's `incompatible_msrv` lint (std
APIs newer than the declared version), which `cargo clippy` checks against this version.

Prints what the default features need and what the core alone (the broker face off, as
`core-check/` builds it) needs. Usage: python3 .ci/msrv.py (from the repository root).
"""
import json
import subprocess
import sys


def run(*args):
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def version(text):
    return tuple(int(part) for part in text.split("."))


def show(v):
    return ".".join(map(str, v))


meta = json.loads(run("cargo", "metadata", "--format-version", "1", "--locked"))
rust_version = {(p["name"], p["version"]): p.get("rust_version") for p in meta["packages"]}


def needs(package):
    """The highest rust-version among the normal and build dependencies of `package`."""
    tree = run("cargo", "tree", "--locked", "-p", package, "-e", "normal,build",
               "--prefix", "none", "--format", "{p}")
    found = []
    for line in set(tree.splitlines()):
        parts = line.split()
        if len(parts) < 2 or parts[0].startswith("kinesis-dataflow"):
            continue
        declared = rust_version.get((parts[0], parts[1].lstrip("v")))
        if declared:
            found.append((version(declared), parts[0]))
    return max(found)


root = next(p for p in meta["packages"] if p["name"] == "kinesis-dataflow")
declared = version(root["rust_version"])
(full, full_by), (core, core_by) = needs("kinesis-dataflow"), needs("kinesis-dataflow-core-check")
print(f"declared rust-version: {show(declared)}")
print(f"dependencies need, default features: {show(full)} ({full_by})")
print(f"dependencies need, broker face off:  {show(core)} ({core_by})")
if declared != full:
    print(f"error: rust-version should be {show(full)}, the highest a dependency needs",
          file=sys.stderr)
    sys.exit(1)
