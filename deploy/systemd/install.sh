#!/usr/bin/env bash
# Install gpuwarden systemd units: deploy/systemd/install.sh SERVICE... (collector, otlp-bridge,
# slurm-watcher, correlator, correlator-events, detector, remediator). Creates the system user `gpuwarden`, copies
# gpuwarden-SERVICE.service to /etc/systemd/system/ and SERVICE.env to /etc/gpuwarden/ (an
# existing env file is kept: it holds your settings), then `systemctl daemon-reload`.
# The units run /opt/gpuwarden/bin/gpuwarden (see the README's install section).
# DESTDIR=/some/root installs below that root and skips useradd and systemctl (packaging, tests).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=${DESTDIR:-}
[ $# -gt 0 ] || { echo "usage: $0 SERVICE..." >&2; exit 2; }
for s in "$@"; do
    [ -f "$here/gpuwarden-$s.service" ] || { echo "unknown service '$s' (no $here/gpuwarden-$s.service)" >&2; exit 2; }
done
if [ -z "$root" ] && ! id -u gpuwarden >/dev/null 2>&1; then
    useradd --system --home-dir /var/lib/gpuwarden --no-create-home --shell /usr/sbin/nologin gpuwarden
fi
install -d -m 0755 "$root/etc/systemd/system"
install -d -m 0750 "$root/etc/gpuwarden"
for s in "$@"; do
    install -m 0644 "$here/gpuwarden-$s.service" "$root/etc/systemd/system/gpuwarden-$s.service"
    if [ -e "$root/etc/gpuwarden/$s.env" ]; then
        echo "kept $root/etc/gpuwarden/$s.env (yours); the shipped one is $here/$s.env"
    else
        install -m 0640 "$here/$s.env" "$root/etc/gpuwarden/$s.env"
    fi
done
[ -n "$root" ] || chgrp gpuwarden /etc/gpuwarden /etc/gpuwarden/*.env
[ -n "$root" ] || systemctl daemon-reload
echo "installed: $*; next: systemctl enable --now $(printf 'gpuwarden-%s ' "$@")"
