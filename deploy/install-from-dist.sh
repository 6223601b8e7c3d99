#!/usr/bin/env bash
# Install gpuwarden into a virtual environment from built artifacts only: no index, no network.
#
#   install-from-dist.sh VENV DIST WHEELHOUSE PACKAGE...
#
# DIST: `make dist` (the gpuwarden wheels, gpuwarden-wheels.txt with their hashes,
# requirements.lock); WHEELHOUSE: `make wheelhouse` (the lock's files). PACKAGE: a service
# (collector slurm-watcher correlator detector otlp-bridge remediator health-check console),
# gpuwarden (the umbrella: demo, simulate, bench; pulls in every service), or a group:
# node (collector health-check), central (every service but the collector), all.
# gpuwarden-shared always comes along. VENV is created with $PYTHON (default python3.11) if absent.
#
# Every file is checked against a hash (pip --require-hashes): the third-party ones against
# requirements.lock, the gpuwarden ones against DIST/gpuwarden-wheels.txt; only the locked
# dependencies of the chosen packages are installed. deploy/Dockerfile runs this script, as
# tests/integration/test_artifacts.py does.
set -euo pipefail
[ $# -ge 4 ] || { sed -n '3,16p' "$0" >&2; exit 2; }
venv=$1 dist=$(cd "$2" && pwd) wh=$(cd "$3" && pwd)
shift 3
lock=$dist/requirements.lock
[ -f "$lock" ] && [ -f "$dist/gpuwarden-wheels.txt" ] || { echo "$dist: not a gpuwarden dist (make dist)" >&2; exit 2; }

want=(shared)
for p in "$@"; do
    case $p in
    node) want+=(collector health-check) ;;
    central) want+=(slurm-watcher correlator detector otlp-bridge remediator console) ;;
    all) want+=(collector slurm-watcher correlator detector otlp-bridge remediator health-check console gpuwarden) ;;
    gpuwarden) want+=(gpuwarden) ;;
    *) want+=("$p") ;;
    esac
done

[ -x "$venv/bin/python" ] || "${PYTHON:-python3.11}" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# the chosen gpuwarden wheels, pinned and hashed
for p in $(printf '%s\n' "${want[@]}" | sort -u); do
    name=gpuwarden-$p
    [ "$p" = gpuwarden ] && name=gpuwarden
    grep -E "^$name==" "$dist/gpuwarden-wheels.txt" >>"$tmp/gpuwarden.txt" \
        || { echo "no $name wheel in $dist" >&2; exit 2; }
done

# no index: only DIST and WHEELHOUSE; wheels only, but for the sdists the wheelhouse holds
# (published as an sdist only; built here with the wheelhouse's setuptools)
no_binary=$(cd "$wh" && ls -- *.tar.gz 2>/dev/null | sed -E 's/-[0-9][^-]*\.tar\.gz$//; s/_/-/g' | paste -sd, -)
opts=(--no-index --find-links "$dist" --find-links "$wh" --no-cache-dir --only-binary :all:)
[ -n "$no_binary" ] && opts+=(--no-binary "$no_binary")

# first the locked pip (a distribution's python3.11 may bring an old one)
awk '/^[A-Za-z0-9]/ { keep = /^pip==/ } keep && !/^ *#/' "$lock" >"$tmp/pip.lock"
"${pip[@]}" install --quiet --no-index --find-links "$wh" --no-cache-dir --only-binary :all: --require-hashes -r "$tmp/pip.lock"

# which locked packages the chosen ones need: pip resolves them against the lock's pins ...
grep -E '^[A-Za-z0-9]' "$lock" | sed 's/ .*//' >"$tmp/pins.txt"
sed 's/ .*//' "$tmp/gpuwarden.txt" >"$tmp/top.txt"
"${pip[@]}" install --quiet --dry-run --ignore-installed --report "$tmp/report.json" "${opts[@]}" \
    -c "$tmp/pins.txt" -r "$tmp/top.txt"
# ... and those blocks of the lock (with their hashes) are installed, with the gpuwarden wheels
"$venv/bin/python" - "$tmp/report.json" "$lock" >"$tmp/subset.lock" <<'PY'
import json, re, sys
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
need = {norm(i["metadata"]["name"]) for i in json.load(open(sys.argv[1]))["install"]}
keep = False
for line in open(sys.argv[2]):
    if line[:1].isalnum():
        keep = norm(line.split("==")[0]) in need
    if keep and not line.lstrip().startswith("#"):
        sys.stdout.write(line)
PY
"${pip[@]}" install --quiet "${opts[@]}" --require-hashes -r "$tmp/subset.lock" -r "$tmp/gpuwarden.txt"
"${pip[@]}" check
