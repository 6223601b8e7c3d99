#!/usr/bin/env bash
# gpuwarden: stop the local Slurm cluster started by deploy/slurm/start-local-slurm.sh.
# Only processes recorded in PID files under /run/gpuwarden-slurm are signalled
# (and only if the PID still belongs to the expected program).
#
#   stop-local-slurm.sh            cancel jobs, stop all daemons
#   stop-local-slurm.sh --purge    ... and delete Slurm state, logs and the accounting DB
#
# Environment: SLURM_STOP_KEEP_JOBS=1 skips cancelling jobs (running job steps
# then keep running and are picked up again by the next start).
set -uo pipefail

RUN=/run/gpuwarden-slurm
SPOOL=/var/spool/gpuwarden-slurm
LOGDIR=/var/log/gpuwarden-slurm
LIB=/var/lib/gpuwarden-slurm
PURGE=0
[ "${1:-}" = "--purge" ] && PURGE=1

log() { printf '[gpuwarden stop-local-slurm] %s %s\n' "$(date +%T)" "$*" >&2; }
[ "$(id -u)" = 0 ] || { log "must run as root"; exit 1; }

running() {  # pid -> true if it exists and is not a zombie
    local st
    st=$(awk '/^State:/{print $2}' "/proc/$1/status" 2>/dev/null) || return 1
    [ -n "$st" ] && [ "$st" != Z ]
}
pid_of() {  # pidfile expected-comm -> prints pid if alive and matching
    local f=$1 want=$2 pid comm
    [ -s "$f" ] || return 1
    pid=$(tr -dc '0-9' < "$f")
    [ -n "$pid" ] && running "$pid" || return 1
    comm=$(cat "/proc/$pid/comm" 2>/dev/null || true)
    case "$comm" in "$want"*) echo "$pid"; return 0 ;; esac
    return 1
}
stop() {  # pidfile comm [timeout-seconds]
    local f=$1 want=$2 t=${3:-15} pid
    if pid=$(pid_of "$f" "$want"); then
        kill "$pid" 2>/dev/null
        for _ in $(seq 1 $((t * 10))); do running "$pid" || break; sleep 0.1; done
        if running "$pid"; then log "$want ($pid) did not exit, SIGKILL"; kill -9 "$pid" 2>/dev/null; fi
        log "stopped $want ($pid)"
    fi
    rm -f "$f"
}

# cancel jobs first so no job processes outlive their slurmd
if [ "${SLURM_STOP_KEEP_JOBS:-0}" != 1 ] && pid_of "$RUN/slurmctld.pid" slurmctld >/dev/null; then
    mapfile -t jobs < <(squeue -h -o %i 2>/dev/null)
    if [ "${#jobs[@]}" -gt 0 ]; then
        log "cancelling jobs: ${jobs[*]}"
        scancel "${jobs[@]}" 2>/dev/null
        for _ in $(seq 1 100); do
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2
        done
    fi
fi

stop "$RUN/socat-restd.pid" socat
stop "$RUN/slurmrestd.pid" slurmrestd
for f in "$RUN"/slurmd-*.pid; do [ -e "$f" ] && stop "$f" slurmd; done
stop "$RUN/slurmctld.pid" slurmctld
stop "$RUN/slurmdbd.pid" slurmdbd
stop "$RUN/mariadb.pid" mariadbd 60
# munged only if this tooling started it (a system munged is left alone)
if pid=$(pid_of "$RUN/munged.pid" munged); then
    stop "$RUN/munged.pid" munged
    rm -f /run/munge/munged.pid
fi

if [ "$PURGE" = 1 ]; then
    rm -rf "$SPOOL" "$LOGDIR" "$LIB/mysql"
    log "purged $SPOOL $LOGDIR $LIB/mysql"
fi
log "done"
