#!/usr/bin/env bash
# gpuwarden Slurm prolog/epilog wrapper: runs `gpuwarden health-check prolog|epilog` for the
# job's GPUs and fails (Slurm then drains the node and requeues the job) on a CRITICAL result.
#
# slurm.conf (see deploy/slurm/README-prolog.md):
#   Prolog=/usr/local/sbin/prolog-gpuwarden.sh
#   Epilog=/usr/local/sbin/epilog-gpuwarden.sh      (a copy or symlink of this file)
#   PrologFlags=Alloc
#   PrologEpilogTimeout=60     must exceed the guard below (default 15 s), or Slurm kills us first
#
# The phase is taken from the script's name (epilog* -> epilog, healthcheck* -> periodic) or from
# $1 (prolog, epilog, periodic). `periodic` is Slurm's HealthCheckProgram mode (slurm.conf:
# HealthCheckProgram=/usr/local/sbin/healthcheck-gpuwarden.sh, HealthCheckInterval=300): it runs
# `gpuwarden health-check run` outside any job, drains with a "gpuwarden periodic: ..." reason and
# always finishes well inside slurmd's 60 s kill (the guard below, 15 s by default).
#
# CPU-only nodes pass without running anything: a node with no /dev/nvidia<N> and no
# /dev/nvidiactl, when the job got no GPUs (SLURM_JOB_GPUS empty) and
# GPUWARDEN_HEALTH_EXPECTED_GPUS is not set above 0; and a job in a partition that is not
# listed in GPUWARDEN_HEALTH_GPU_PARTITIONS (comma separated; unset = every partition is
# checked). So `Prolog=` can be set cluster-wide, as Slurm does it.
#
# Environment (all optional). The env file is parsed, never executed: `KEY=VALUE` lines (an
# optional `export ` prefix; KEY is [A-Z_][A-Z0-9_]*), blank lines and `#` comment lines; one
# pair of surrounding '...' or "..." is removed and the value is taken literally (no $ expansion,
# no escapes, no inline comments). Anything else is logged and skipped. A variable already in
# the environment of the wrapper wins over the file (the file gives defaults; slurmd starts
# prologs with an almost empty environment, so in Slurm the file decides).
#   GPUWARDEN_HEALTH_ENV_FILE=/etc/gpuwarden/health-check.env  the env file (GPUWARDEN_* settings)
#   GPUWARDEN_BIN=gpuwarden              the gpuwarden command (absolute path recommended)
#   GPUWARDEN_HEALTH_FAIL_ON="2"         exit codes that fail the prolog (add 3 to fail on UNKNOWN)
#   GPUWARDEN_HEALTH_DRAIN=1             1 = also `scontrol update state=drain reason="gpuwarden ..."`
#                                        so sinfo -R shows the one-line reason, not only "Prolog error";
#                                        a node already drained with a reason keeps it (first reason wins)
#   GPUWARDEN_HEALTH_WRAPPER_TIMEOUT_S   outer kill guard, s; default derived from the command's own
#                                        limits: ceil(GPUWARDEN_HEALTH_BUDGET_S, 10)
#                                        + ceil(GPUWARDEN_HEALTH_PUBLISH_TIMEOUT_S, 1.5) + 3 = 15 s.
#                                        A run killed by it counts as CRITICAL.
#   GPUWARDEN_HEALTH_LOG=/var/log/gpuwarden/health-check.log  one line per run is appended
#                                        (plus a "warning:" line per configuration problem)
#
# Exit code trust: the command's exit code (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN) counts only
# when the first line it prints starts with that status word ("CRITICAL: ..."). Anything else (a
# crash, a usage error, an old gpuwarden without `health-check`, no output) becomes UNKNOWN:
# "gpuwarden health-check <phase> exited N without a result: <its last stderr line>".
set -u

warnings=()
warn() { warnings+=("$1"); }
# a line of untrusted text made safe for one log line: control characters -> '?', cut
printable() { local s=${1//[$'\001'-$'\037\177']/?}; printf '%s' "${s:0:$2}"; }

phase=${1:-}
if [ -z "$phase" ]; then
    case "$(basename "$0")" in
        epilog*) phase=epilog ;;
        healthcheck*) phase=periodic ;;
        *) phase=prolog ;;
    esac
fi
case "$phase" in prolog|epilog|periodic) ;; *) echo "usage: $0 [prolog|epilog|periodic]" >&2; exit 2 ;; esac

# --- the env file: data, never executed (bash builtins only: PATH may not be set yet) ---------
# the caller's environment: exported names only (bash itself sets a few variables, PATH among
# them, without exporting them when they are not in its environment)
declare -A caller_env=() from_file=()
while IFS= read -r k; do caller_env[$k]=1; done < <(compgen -e)
env_file=${GPUWARDEN_HEALTH_ENV_FILE:-/etc/gpuwarden/health-check.env}
if [ -f "$env_file" ] && [ -r "$env_file" ]; then
    upper=ABCDEFGHIJKLMNOPQRSTUVWXYZ   # not [A-Z]: a locale's collation may put lowercase in it
    kv_re="^(export[[:space:]]+)?([${upper}_][${upper}0-9_]*)=(.*)\$"
    dq_re='^"(.*)"[[:space:]]*$'
    sq_re="^'(.*)'[[:space:]]*\$"
    n=0
    while IFS= read -r raw || [ -n "$raw" ]; do
        n=$((n + 1))
        l=${raw%$'\r'}
        l=${l#"${l%%[![:space:]]*}"}   # leading blanks
        if [ -z "$l" ] || [ "${l:0:1}" = "#" ]; then continue; fi
        if [[ ! $l =~ $kv_re ]]; then
            warn "$env_file line $n is not KEY=VALUE, skipped: $(printable "$l" 80)"
            continue
        fi
        key=${BASH_REMATCH[2]} val=${BASH_REMATCH[3]}
        if [[ $val =~ $dq_re ]] || [[ $val =~ $sq_re ]]; then
            val=${BASH_REMATCH[1]}
        elif [[ $val == [\"\']* ]]; then
            warn "$env_file line $n ($key): a quoted value must end with its closing quote, skipped"
            continue
        else
            val=${val%"${val##*[![:space:]]}"}   # trailing blanks
        fi
        # the caller's environment wins; a key repeated in the file: the last one wins
        if [ -n "${caller_env[$key]:-}" ]; then continue; fi
        if export "$key=$val" 2>/dev/null; then
            from_file[$key]=1
        else
            warn "$env_file line $n: $key cannot be set (a read-only shell variable), skipped"
        fi
    done <"$env_file"
elif [ -n "${GPUWARDEN_HEALTH_ENV_FILE:-}" ]; then
    warn "env file $env_file is not a readable file; using the environment only"
fi

# slurmd runs prologs without PATH (bash's own default would end in "."): a fixed one then
if [ -z "${caller_env[PATH]:-}" ] && [ -z "${from_file[PATH]:-}" ]; then
    export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
fi

bin=${GPUWARDEN_BIN:-gpuwarden}
logf=${GPUWARDEN_HEALTH_LOG:-/var/log/gpuwarden/health-check.log}
node=${SLURMD_NODENAME:-$(hostname -s)}
job=${SLURM_JOB_ID:-none}

fail_on_s=${GPUWARDEN_HEALTH_FAIL_ON:-2}
fail_on=()
read -r -a fail_on <<<"${fail_on_s//,/ }"   # "2 3" or "2,3"; split without globbing
for code in ${fail_on[@]+"${fail_on[@]}"}; do
    case $code in 0|1|2|3) ;; *) warn "GPUWARDEN_HEALTH_FAIL_ON: '$(printable "$code" 20)' is not an exit code 0-3, ignored" ;; esac
done

# --- the guard ----------------------------------------------------------------------------------
# ceil of a plain positive decimal (at most 9 integer digits); fails for anything else or <= 0
ceil_pos() {
    [[ $1 =~ ^([0-9]{0,9})(\.([0-9]*))?$ ]] || return 1
    local i=${BASH_REMATCH[1]} f=${BASH_REMATCH[3]}
    [ -n "$i$f" ] || return 1
    i=$((10#${i:-0}))
    if [[ $f =~ [1-9] ]]; then i=$((i + 1)); fi
    [ "$i" -gt 0 ] || return 1
    printf '%s' "$i"
}
budget=${GPUWARDEN_HEALTH_BUDGET_S:-10}
budget=${budget//[[:space:]]/}   # pydantic reads " 20" as 20: so must the guard
[ -n "$budget" ] || budget=10
if ! b=$(ceil_pos "$budget"); then
    warn "GPUWARDEN_HEALTH_BUDGET_S='$(printable "$budget" 40)' is not a plain positive number: guard derived from 10 s"
    b=10
fi
publish=${GPUWARDEN_HEALTH_PUBLISH_TIMEOUT_S:-1.5}
p=$(ceil_pos "$publish") || p=2
derived=$((b + p + 3))   # the command's worst case: budget + publish timeout + ~1 s start
guard=$derived
if [ -n "${GPUWARDEN_HEALTH_WRAPPER_TIMEOUT_S:-}" ]; then
    want=$GPUWARDEN_HEALTH_WRAPPER_TIMEOUT_S
    if g=$(ceil_pos "$want"); then
        guard=$want
        if [ "$g" -lt "$derived" ]; then
            warn "GPUWARDEN_HEALTH_WRAPPER_TIMEOUT_S=$want is below the ${derived}s a run may take (budget ${budget}s): a slow run is killed and counts as CRITICAL"
        fi
    else
        warn "GPUWARDEN_HEALTH_WRAPPER_TIMEOUT_S='$(printable "$want" 40)' is not a positive number of seconds: using ${derived}s"
    fi
fi

# --- CPU-only nodes and jobs outside the GPU partitions pass -------------------------------------
skip=
expected=${GPUWARDEN_HEALTH_EXPECTED_GPUS:-}
expected=${expected//[[:space:]]/}
if [[ $expected =~ ^[0-9]+$ ]] && [ "$((10#$expected))" -gt 0 ]; then
    :   # a GPU node by configuration: always checked (a missing driver is a failure there)
else
    gpu_parts=${GPUWARDEN_HEALTH_GPU_PARTITIONS:-}
    job_part=${SLURM_JOB_PARTITION:-}
    if [ -n "$gpu_parts" ] && [ -n "$job_part" ] && [ "$phase" != periodic ]; then
        in_list=0
        IFS=', ' read -r -a parts <<<"$gpu_parts"
        for p in ${parts[@]+"${parts[@]}"}; do [ "$p" = "$job_part" ] && in_list=1; done
        [ "$in_list" = 1 ] || skip="partition $(printable "$job_part" 40) is not a GPU partition (GPUWARDEN_HEALTH_GPU_PARTITIONS)"
    fi
    if [ -z "$skip" ] && [ -z "${SLURM_JOB_GPUS:-}" ]; then
        dev=${GPUWARDEN_HEALTH_DEV_DIR:-/dev}
        shopt -s nullglob
        nv=("$dev"/nvidia[0-9]*)
        shopt -u nullglob
        [ -e "$dev/nvidiactl" ] && nv+=("$dev/nvidiactl")
        if [ "${#nv[@]}" -eq 0 ]; then
            # An NVIDIA display/3D controller on the PCI bus (vendor 0x10de, class 0x0300/0x0302)
            # without its /dev nodes is a GPU node whose driver failed, not a CPU-only node.
            pci=0
            for d in "${GPUWARDEN_HEALTH_SYS_DIR:-/sys}"/bus/pci/devices/*; do
                [ -r "$d/vendor" ] && [ -r "$d/class" ] || continue
                read -r v <"$d/vendor" || continue
                read -r c <"$d/class" || continue
                if [ "$v" = 0x10de ] && { [[ $c == 0x0300* ]] || [[ $c == 0x0302* ]]; }; then pci=1; break; fi
            done
            [ "$pci" = 1 ] || skip="no NVIDIA device in $dev: CPU-only node"
        fi
    fi
fi

# --- run ----------------------------------------------------------------------------------------
errf=$(mktemp "${TMPDIR:-/tmp}/gpuwarden-$phase.XXXXXX" 2>/dev/null) || errf=
trap 'if [ -n "$errf" ]; then rm -f -- "$errf"; fi' EXIT
sub=$phase
[ "$phase" = periodic ] && sub=run   # `gpuwarden health-check run`: the periodic checks
if [ -n "$skip" ]; then
    out="OK: $skip, nothing to check"
    rc=0
else
    out=$(timeout -k 2 "$guard" "$bin" health-check "$sub" 2>"${errf:-/dev/null}")
    rc=$?
fi
first=${out%%$'\n'*}
first=${first%$'\r'}
# the command's last stderr line that says something (rich's box drawing and colours removed)
err=
if [ -n "$errf" ] && [ -s "$errf" ]; then
    err=$(sed -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/│\|╭\|╮\|╰\|╯\|─//g' \
        -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' "$errf" 2>/dev/null | grep -a '[[:alnum:]]' | tail -n 1)
    err=$(printable "$err" 200)
fi
case $rc in
    124|137) line="CRITICAL: gpuwarden health-check $sub ran past ${guard}s and was killed"; rc=2 ;;
    126|127) line="UNKNOWN: cannot run $bin${err:+: $err}"; rc=3 ;;
    *)
        words=(OK WARNING CRITICAL UNKNOWN)
        if [ "$rc" -le 3 ] && [[ $first == "${words[rc]}:"* ]]; then
            line=$first
        else
            detail=${err:-${first:+printed: $(printable "$first" 150)}}
            line="UNKNOWN: gpuwarden health-check $sub exited $rc without a result: ${detail:-no output}"
            rc=3
        fi
        ;;
esac

# --- report -------------------------------------------------------------------------------------
msg="node=$node job=$job phase=$phase rc=$rc $line"
if mkdir -p "$(dirname "$logf")" 2>/dev/null; then
    {
        ts=$(date -u +%FT%TZ)
        printf '%s %s\n' "$ts" "$msg"
        for w in ${warnings[@]+"${warnings[@]}"}; do
            printf '%s node=%s job=%s phase=%s warning: %s\n' "$ts" "$node" "$job" "$phase" "$w"
        done
    } >>"$logf" 2>/dev/null
fi
have_logger=0
command -v logger >/dev/null 2>&1 && have_logger=1
if [ "$have_logger" = 1 ]; then logger -t "gpuwarden-$phase" -- "$msg" 2>/dev/null; fi
for w in ${warnings[@]+"${warnings[@]}"}; do
    echo "gpuwarden-$phase warning: $w" >&2
    if [ "$have_logger" = 1 ]; then logger -t "gpuwarden-$phase" -- "warning: $w" 2>/dev/null; fi
done

for code in ${fail_on[@]+"${fail_on[@]}"}; do
    if [ "$rc" = "$code" ]; then
        if [ "${GPUWARDEN_HEALTH_DRAIN:-1}" = 1 ] && command -v scontrol >/dev/null 2>&1; then
            # first reason wins: a node already draining/drained (by an operator, the remediator,
            # or this prolog before the epilog Slurm runs for the requeued job) keeps its reason
            current=$(scontrol -o show node "$node" 2>/dev/null)
            if [[ $current =~ \ State=[^\ ]*DRAIN ]] && [[ $current =~ \ Reason=[^\ ] ]]; then
                msg="$msg (node already drained: reason kept)"
                printf '%s node=%s job=%s phase=%s drain skipped: node already drained, its reason kept\n' \
                    "$(date -u +%FT%TZ)" "$node" "$job" "$phase" >>"$logf" 2>/dev/null || true
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
