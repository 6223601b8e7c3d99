#!/usr/bin/env bash
# Build the artifacts gpuwarden installs from (README, Install). Needs the network (PyPI).
#
#   deploy/build-dist.sh dist DIR        wheel + sdist of every gpuwarden package into DIR, with
#                                        DIR/gpuwarden-wheels.txt (their sha256), a copy of
#                                        requirements.lock and of deploy/install-from-dist.sh
#   deploy/build-dist.sh wheelhouse DIR  every file of requirements.lock into DIR, each checked
#                                        against the lock's hashes (wheels for Linux x86_64,
#                                        CPython 3.11: run it with that python)
#
# PY: the python that builds (default python3; it needs the `build` package for `dist`).
# make dist / make wheelhouse run it with .venv/bin/python; deploy/Dockerfile runs it in its
# first stage. The gpuwarden-* names are never looked up on an index: only their build backend
# (hatchling) and the locked third-party files are downloaded.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
PY=${PY:-python3}
# Locked packages that PyPI publishes as an sdist only: the wheelhouse keeps their hash-checked
# sdist and install-from-dist.sh builds it offline with the locked setuptools.
SDIST_ONLY=(python-hostlist)
PACKAGES=(shared services/collector services/slurm-watcher services/correlator services/detector
          services/otlp-bridge services/remediator services/health-check services/console .)

usage() { echo "usage: $0 dist DIR | wheelhouse DIR" >&2; exit 2; }
[ $# = 2 ] || usage
out=$2
mkdir -p "$out"
out=$(cd "$out" && pwd)

case $1 in
dist)
    for pkg in "${PACKAGES[@]}"; do
        "$PY" -m build --outdir "$out" "$root/$pkg" >"$out/.build.log" 2>&1 \
            || { cat "$out/.build.log" >&2; echo "build of $pkg failed" >&2; exit 1; }
    done
    rm -f "$out/.build.log"
    cp "$root/requirements.lock" "$here/install-from-dist.sh" "$out/"
    (
        cd "$out"
        for whl in gpuwarden*.whl; do
            name=$(echo "${whl%%-py3-*}" | sed 's/-/==/; s/_/-/g')  # gpuwarden_otlp_bridge-0.1.0 -> gpuwarden-otlp-bridge==0.1.0
            echo "$name --hash=sha256:$(sha256sum "$whl" | cut -d' ' -f1)"
        done
    ) >"$out/gpuwarden-wheels.txt"
    ;;
wheelhouse)
    no_binary=$(IFS=,; echo "${SDIST_ONLY[*]}")
    "$PY" -m pip download --quiet --disable-pip-version-check --require-hashes -r "$root/requirements.lock" \
        --dest "$out" --only-binary :all: --no-binary "$no_binary"
    ;;
*) usage ;;
esac
