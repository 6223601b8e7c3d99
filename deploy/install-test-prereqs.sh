#!/usr/bin/env bash
# Install what the test suite needs from outside the checkout, when missing: the Debian packages
# of deploy/debian-packages.txt (Slurm, Alertmanager, Prometheus, Chromium, ...), Java and Maven
# (Apache Kafka from its Maven jars, deploy/kafka.sh). Nothing to do when all are there; else it
# needs root (apt-get). Used by .ci/run and by `make test`, `make test-unit`, `make test-integration`.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
need=""
for p in $(grep -v '^#' deploy/debian-packages.txt); do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need="$need $p"
done
command -v java >/dev/null || need="$need openjdk-17-jre-headless"
command -v mvn >/dev/null || need="$need maven"
[ -z "$need" ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "error: the tests need these Debian packages:$need; install them as root (apt-get install$need) or run: sudo make prereqs" >&2
    exit 1
fi
echo "apt-get install:$need" >&2
apt-get -o DPkg::Lock::Timeout=300 update -q >/dev/null
apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends $need >/dev/null
