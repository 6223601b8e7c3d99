#!/usr/bin/env bash
# gpuwarden Slurm prolog/epilog wrapper: runs `gpuwarden health-check prolog|epilog` for the
# job's GPUs and fails (Slurm then drains the node and requeues the job) on a CRITICAL result.
#
# slurm.conf (see deploy/slurm/README-prolog.md):
#   Prolog=/usr/local/sbin/prolog-gpuwarden.sh
#   Epilog=/usr/local/sbin/epilog-gpuwarden.sh      (a copy or symlink of this file)
#   PrologFlags=Alloc
#
# The phase is taken from the script's name (epilog* -> epilog) or from $1.
# Environment (all optional; an env file is read first, see GPUWARDEN_HEALTH_ENV_FILE):
#   GPUWARDEN_HEALTH_ENV_FILE=/etc/gpuwarden/health-check.env  KEY=VALUE lines (GPUWARDEN_* settings)
#   GPUWARDEN_BIN=gpuwarden              the gpuwarden command (absolute path recommended)
#   GPUWARDEN_HEALTH_FAIL_ON="2"         exit codes that fail the prolog (add 3 to fail on UNKNOWN)
#   GPUWARDEN_HEALTH_DRAIN=1             1 = also `scontrol update state=drain reason="gpuwarden ..."`
#                                        so sinfo -R shows the one-line reason, not only "Prolog error";
#                                        a node already drained with a reason keeps it (first reason wins)
#   GPUWARDEN_HEALTH_WRAPPER_TIMEOUT_S=15  outer kill guard (the command's own budget is 10 s)
#   GPUWARDEN_HEALTH_LOG=/var/log/gpuwarden/health-check.log  one line per run is appended
set -u
# slurmd runs prologs with a minimal environment
export PATH=${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}

phase=${1:-}
if [ -z "$phase" ]; then
    case "$(basename "$0")" in
        epilog*) phase=epilog ;;
        *) phase=prolog ;;
    esac
fi
case "$phase" in prolog|epilog) ;; *) echo "usage: $0 [prolog|epilog]" >&2; exit 2 ;; esac

env_file=${GPUWARDEN_HEALTH_ENV_FILE:-/etc/gpuwarden/health-check.env}
if [ -r "$env_file" ]; then
    set -a
    # shellcheck disable=SC1090
    . "$env_file"
    set +a
fi

bin=${GPUWARDEN_BIN:-gpuwarden}
fail_on=${GPUWARDEN_HEALTH_FAIL_ON:-2}
guard=${GPUWARDEN_HEALTH_WRAPPER_TIMEOUT_S:-15}
logf=${GPUWARDEN_HEALTH_LOG:-/var/log/gpuwarden/health-check.log}
node=${SLURMD_NODENAME:-$(hostname -s)}
job=${SLURM_JOB_ID:-none}

line=$(timeout -k 2 "$guard" "$bin" health-check "$phase" 2>/dev/null)
rc=$?
case $rc in
    124|137) line="CRITICAL: gpuwarden health-check $phase ran past ${guard}s and was killed"; rc=2 ;;
    126|127) line="UNKNOWN: cannot run $bin"; rc=3 ;;
esac
line=$(printf '%s' "$line" | head -n 1)

msg="node=$node job=$job phase=$phase rc=$rc $line"
mkdir -p "$(dirname "$logf")" 2>/dev/null && printf '%s %s\n' "$(date -u +%FT%TZ)" "$msg" >>"$logf" 2>/dev/null
command -v logger >/dev/null 2>&1 && logger -t "gpuwarden-$phase" -- "$msg" 2>/dev/null

for code in $fail_on; do
    if [ "$rc" = "$code" ]; then
        if [ "${GPUWARDEN_HEALTH_DRAIN:-1}" = 1 ] && command -v scontrol >/dev/null 2>&1; then
            # first reason wins: a node already draining/drained (by an operator, the remediator,
            # or this prolog before the epilog Slurm runs for the requeued job) keeps its reason
            current=$(scontrol -o show node "$node" 2>/dev/null)
            if [[ $current =~ \ State=[^\ ]*DRAIN ]] && [[ $current =~ \ Reason=[^\ ] ]]; then
                msg="$msg (node already drained: reason kept)"
            else
                reason="gpuwarden $phase: ${line:0:200}"
                scontrol update nodename="$node" state=drain reason="$reason" >/dev/null 2>&1 || true
            fi
        fi
        echo "$msg" >&2
        exit 1
    fi
done
exit 0
