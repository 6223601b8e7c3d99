"""The Slurm prolog/epilog wrapper (deploy/slurm/prolog-gpuwarden.sh, epilog-gpuwarden.sh), run
for real with bash against fake executables in tmp_path: ``gpuwarden`` (prints a given line,
exits with a given code, sleeps, crashes), ``scontrol`` (records its argv, answers
``-o show node`` with a given line), ``logger`` (records) and, where the guard is checked,
``timeout`` (records its argv, then runs the real one). The environment is as clean as slurmd's.
Also the ``gpuwarden health-check`` side of the contract: usage errors and a bad ``--budget``
are UNKNOWN (exit 3) with one ``UNKNOWN:`` line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROLOG = ROOT / "deploy" / "slurm" / "prolog-gpuwarden.sh"
EPILOG = ROOT / "deploy" / "slurm" / "epilog-gpuwarden.sh"
GPUWARDEN = Path(sys.executable).with_name("gpuwarden")
REAL_TIMEOUT = shutil.which("timeout") or "/usr/bin/timeout"
NODE, JOB = "node-7", "4242"
OK_LINE = "OK: all checks passed | 9 checks in 0.02s"
UNDRAINED = f"NodeName={NODE} Arch=x86_64 CoresPerSocket=1 State=IDLE ThreadsPerCore=1 Partitions=gpu"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/opt/gpuwarden/lib/python3.11/site-packages/gpuwarden/health_check/run.py", line 1, in <module>\n'
    "RuntimeError: NVML went away\n"
)
# what typer + rich print for an umbrella without the health-check plugin (an old gpuwarden)
RICH_USAGE = (
    "Usage: gpuwarden [OPTIONS] COMMAND [ARGS]...\n"
    "Try 'gpuwarden --help' for help.\n"
    "╭─ Error ──────────────────────────────────────────────────────────────────────╮\n"
    "│ No such command 'health-check'.                                              │\n"
    "╰──────────────────────────────────────────────────────────────────────────────╯\n"
)

FAKE_GPUWARDEN = """#!/bin/bash
# fake gpuwarden: records argv and environment; prints ./stdout and ./stderr; sleeps; exits ./rc
d=@DIR@
printf '%s\\n' "$@" > "$d/argv"
env -0 > "$d/env"
if [ -e "$d/ignore-term" ]; then trap '' TERM; fi
if [ -e "$d/stdout" ]; then cat "$d/stdout"; fi
if [ -e "$d/stderr" ]; then cat "$d/stderr" >&2; fi
if [ -e "$d/sleep" ]; then sleep "$(cat "$d/sleep")"; fi
exit "$(cat "$d/rc" 2>/dev/null || echo 0)"
"""
# each call: its argv joined by \\x1f, terminated by \\x1e (so one element may hold anything)
RECORDER = """#!/bin/bash
d=@DIR@
{ printf '%s\\x1f' "$@"; printf '\\x1e'; } >> "$d/@NAME@.calls"
"""
FAKE_SCONTROL = (
    RECORDER
    + """if [ "$1 $2 $3" = "-o show node" ] && [ -e "$d/node" ]; then cat "$d/node"; fi
exit 0
"""
)
FAKE_TIMEOUT = RECORDER + f'exec {REAL_TIMEOUT} "$@"\n'


def _calls(f: Path) -> list[list[str]]:
    if not f.exists():
        return []
    return [c.split("\x1f")[:-1] for c in f.read_text().split("\x1e")[:-1]]


@dataclass
class Rig:
    """tmp_path with the fakes; ``run`` runs a wrapper and returns its process."""

    dir: Path
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.bin = self.dir / "bin"
        self.bin.mkdir()
        self.tbin = self.dir / "tbin"  # the recording timeout, first on PATH only when asked
        self.tbin.mkdir()
        self.tmp = self.dir / "tmp"
        self.tmp.mkdir()
        self.gpuwarden = self._exe(self.bin / "gpuwarden", FAKE_GPUWARDEN)
        self._exe(self.bin / "scontrol", FAKE_SCONTROL.replace("@NAME@", "scontrol"))
        self._exe(self.bin / "logger", (RECORDER + "exit 0\n").replace("@NAME@", "logger"))
        self._exe(self.tbin / "timeout", FAKE_TIMEOUT.replace("@NAME@", "timeout"))
        self.log = self.dir / "log" / "health.log"
        self.env_file = self.dir / "health.env"
        self.env_file.write_text("")
        self.node(UNDRAINED)
        self.devdir = self.dir / "dev"
        self.devdir.mkdir()
        (self.devdir / "nvidia0").write_text("")
        self.env = {
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "TMPDIR": str(self.tmp),
            "GPUWARDEN_BIN": str(self.gpuwarden),
            "GPUWARDEN_HEALTH_DRAIN": "1",
            "GPUWARDEN_HEALTH_LOG": str(self.log),
            "GPUWARDEN_HEALTH_ENV_FILE": str(self.env_file),
            "SLURMD_NODENAME": NODE,
            "SLURM_JOB_ID": JOB,
            "GPUWARDEN_HEALTH_DEV_DIR": str(self.devdir),  # a GPU node: the CPU-only pass is tested on its own
        }

    def _exe(self, path: Path, text: str) -> Path:
        path.write_text(text.replace("@DIR@", str(self.dir)))
        path.chmod(0o755)
        return path

    def result(self, stdout: str = "", rc: int = 0, stderr: str = "") -> None:
        """What the fake gpuwarden prints and how it exits."""
        (self.dir / "stdout").write_text(stdout)
        (self.dir / "stderr").write_text(stderr)
        (self.dir / "rc").write_text(str(rc))

    def node(self, line: str) -> None:
        """What ``scontrol -o show node`` prints."""
        (self.dir / "node").write_text(line + "\n")

    def run(
        self, *args: str, script: Path = PROLOG, record_timeout: bool = False, **env: str
    ) -> subprocess.CompletedProcess[str]:
        e = {**self.env, **env}
        if record_timeout:
            e["PATH"] = f"{self.tbin}:{e['PATH']}"
        p = subprocess.run(
            ["bash", str(script), *args], env=e, cwd=self.dir, capture_output=True, text=True, timeout=20
        )
        assert not list(self.tmp.iterdir()), "the stderr temp file was not removed"
        return p

    @property
    def scontrol(self) -> list[list[str]]:
        return _calls(self.dir / "scontrol.calls")

    @property
    def logger(self) -> list[list[str]]:
        return _calls(self.dir / "logger.calls")

    @property
    def timeout_argv(self) -> list[str]:
        (argv,) = _calls(self.dir / "timeout.calls")
        return argv

    @property
    def argv(self) -> list[str]:
        """The fake gpuwarden's arguments."""
        return (self.dir / "argv").read_text().splitlines()

    @property
    def seen_env(self) -> dict[str, str]:
        """The fake gpuwarden's environment."""
        items = (self.dir / "env").read_bytes().decode().split("\0")
        return dict(kv.split("=", 1) for kv in items if kv)

    def log_lines(self) -> list[str]:
        """The health log without timestamps."""
        return [ln.split(" ", 1)[1] for ln in self.log.read_text().splitlines()]

    def drained_with(self, phase: str, line: str) -> list[list[str]]:
        return [
            ["-o", "show", "node", NODE],
            ["update", f"nodename={NODE}", "state=drain", f"reason=gpuwarden {phase}: {line[:200]}"],
        ]


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


def test_healthy_node_passes_without_drain(rig: Rig) -> None:
    rig.result(OK_LINE + "\n", 0)
    p = rig.run()
    assert p.returncode == 0, p.stderr
    assert rig.argv == ["health-check", "prolog"]
    assert rig.scontrol == []
    msg = f"node={NODE} job={JOB} phase=prolog rc=0 {OK_LINE}"
    assert rig.log_lines() == [msg]
    assert rig.logger == [["-t", "gpuwarden-prolog", "--", msg]]
    assert p.stderr == ""


def test_critical_drains_with_the_reason_as_one_argument(rig: Rig) -> None:
    pwn = rig.dir / "pwned"
    line = (
        f"CRITICAL: ecc: GPU 0: \"quoted\" 'single' $(touch {pwn}) `touch {pwn}` $HOME ${{IFS}}; x=1 "
        + "y" * 200
        + " | 9 checks in 0.1s"
    )
    rig.result(line + "\nsecond line ignored\n", 2)
    p = rig.run()
    assert p.returncode == 1
    assert rig.scontrol == rig.drained_with("prolog", line)  # the reason: one argv element, cut at 200
    assert not pwn.exists()
    msg = f"node={NODE} job={JOB} phase=prolog rc=2 {line}"
    assert rig.log_lines() == [msg]
    assert p.stderr.strip() == msg


@pytest.mark.parametrize("state", ["IDLE+DRAIN", "MIXED+DRAIN", "DOWN+DRAIN+NOT_RESPONDING", "DRAINED", "DRAINING"])
def test_an_already_drained_node_keeps_its_reason(rig: Rig, state: str) -> None:
    rig.node(f"NodeName={NODE} Arch=x86_64 State={state} Reason=operator:_maintenance [root@2025-01-01T00:00:00]")
    rig.result("CRITICAL: ecc: GPU 0: uncorrectable ECC | 9 checks in 0.1s\n", 2)
    p = rig.run()
    assert p.returncode == 1
    assert rig.scontrol == [["-o", "show", "node", NODE]]  # no update: the first reason wins
    assert "(node already drained: reason kept)" in p.stderr


def test_drain_off_fails_without_scontrol(rig: Rig) -> None:
    rig.result("CRITICAL: ecc: GPU 0: bad\n", 2)
    p = rig.run(GPUWARDEN_HEALTH_DRAIN="0")
    assert p.returncode == 1 and rig.scontrol == []


@pytest.mark.parametrize(
    ("rc", "line", "fail_on", "fails"),
    [
        (1, "WARNING: clocks: GPU 1: SW thermal slowdown | 9 checks in 0.1s", None, False),
        (3, "UNKNOWN: xid: no kernel log | 9 checks in 0.1s", None, False),
        (1, "WARNING: clocks: GPU 1: SW thermal slowdown", "1 2", True),
        (3, "UNKNOWN: xid: no kernel log", "2,3", True),
        (3, "UNKNOWN: xid: no kernel log", "2  3", True),
        (2, "CRITICAL: ecc: GPU 0: bad", "3", False),
        (0, OK_LINE, "* 0", True),  # a word is not a glob; 0 fails an OK run if asked to
    ],
)
def test_warning_and_unknown_pass_unless_fail_on_names_them(
    rig: Rig, rc: int, line: str, fail_on: str | None, fails: bool
) -> None:
    rig.result(line + "\n", rc)
    p = rig.run(**({"GPUWARDEN_HEALTH_FAIL_ON": fail_on} if fail_on is not None else {}))
    assert p.returncode == (1 if fails else 0)
    assert rig.scontrol == (rig.drained_with("prolog", line) if fails else [])
    assert rig.log_lines()[0] == f"node={NODE} job={JOB} phase=prolog rc={rc} {line}"
    if fail_on == "* 0":
        assert "warning: GPUWARDEN_HEALTH_FAIL_ON: '*' is not an exit code 0-3, ignored" in rig.log_lines()[1]


@pytest.mark.parametrize(
    ("stdout", "rc", "stderr", "detail"),
    [
        ("", 1, TRACEBACK, "RuntimeError: NVML went away"),  # a Python crash
        ("", 2, RICH_USAGE, "No such command 'health-check'."),  # an old gpuwarden: no drain on rc 2
        (
            "",
            2,
            "Usage: gpuwarden health-check prolog [OPTIONS]\nTry 'gpuwarden health-check prolog --help' for help.\n"
            "\nError: No such option: --budgett\n",
            "Error: No such option: --budgett",
        ),
        ("", 0, "", "no output"),
        ("\n", 2, "", "no output"),
        ("CRITICAL: ecc: GPU 0: bad\n", 0, "", "printed: CRITICAL: ecc: GPU 0: bad"),  # code and word disagree
        ("OK: fine\n", 2, "", "printed: OK: fine"),
        ("Segmentation fault\n", 139, "", "printed: Segmentation fault"),
        ("", 1, "\x1b[31mboom\x1b[0m\twith\x01control\n\n   \n", "boom?with?control"),
    ],
)
def test_a_result_without_its_status_word_is_unknown(rig: Rig, stdout: str, rc: int, stderr: str, detail: str) -> None:
    rig.result(stdout, rc, stderr)
    p = rig.run()
    assert p.returncode == 0, p.stderr  # UNKNOWN: logged, the job runs
    assert rig.scontrol == []
    want = f"UNKNOWN: gpuwarden health-check prolog exited {rc} without a result: {detail}"
    assert rig.log_lines() == [f"node={NODE} job={JOB} phase=prolog rc=3 {want}"]


def test_a_crash_drains_when_unknown_fails_and_the_reason_is_cut(rig: Rig) -> None:
    long = "RuntimeError: " + "z" * 400
    rig.result("", 1, TRACEBACK + long + "\n")
    p = rig.run(GPUWARDEN_HEALTH_FAIL_ON="2 3")
    assert p.returncode == 1
    (_, update) = rig.scontrol
    reason = update[-1]
    assert reason.startswith("reason=gpuwarden prolog: UNKNOWN: gpuwarden health-check prolog exited 1 without a ")
    assert reason.endswith("zzz") and len(reason) == len("reason=gpuwarden prolog: ") + 200


def test_a_command_that_cannot_run_is_unknown(rig: Rig) -> None:
    missing = rig.dir / "no-such-gpuwarden"
    p = rig.run(GPUWARDEN_BIN=str(missing))
    assert p.returncode == 0 and rig.scontrol == []
    (line,) = rig.log_lines()
    assert f"rc=3 UNKNOWN: cannot run {missing}: " in line and "No such file or directory" in line
    noexec = rig.dir / "noexec"
    noexec.write_text("#!/bin/sh\n")
    p = rig.run(GPUWARDEN_BIN=str(noexec), GPUWARDEN_HEALTH_FAIL_ON="3")
    assert p.returncode == 1
    assert rig.scontrol[-1][-1].startswith(f"reason=gpuwarden prolog: UNKNOWN: cannot run {noexec}")


@pytest.mark.parametrize(("ignore_term", "rc"), [(False, 124), (True, 137)])
def test_a_hung_command_is_killed_at_the_guard(rig: Rig, ignore_term: bool, rc: int) -> None:
    rig.result("", 0)
    (rig.dir / "sleep").write_text("30")
    if ignore_term:  # SIGTERM ignored: timeout's SIGKILL 2 s later
        (rig.dir / "ignore-term").touch()
    t0 = time.monotonic()
    p = rig.run(GPUWARDEN_HEALTH_WRAPPER_TIMEOUT_S="1", record_timeout=True)
    took = time.monotonic() - t0
    assert p.returncode == 1
    assert (3.0 if ignore_term else 1.0) <= took < (6.0 if ignore_term else 4.0)
    line = "CRITICAL: gpuwarden health-check prolog ran past 1s and was killed"
    assert rig.scontrol == rig.drained_with("prolog", line)
    log = rig.log_lines()
    assert log[0] == f"node={NODE} job={JOB} phase=prolog rc=2 {line}"
    # a guard below what a run may take is used, and said
    want = "GPUWARDEN_HEALTH_WRAPPER_TIMEOUT_S=1 is below the 15s a run may take (budget 10s): a slow run is killed"
    assert log[1].endswith(f"warning: {want} and counts as CRITICAL"), log


@pytest.mark.parametrize(
    ("env", "guard"),
    [
        ({}, "15"),  # ceil(10) + ceil(1.5) + 3
        ({"GPUWARDEN_HEALTH_BUDGET_S": "1"}, "6"),
        ({"GPUWARDEN_HEALTH_BUDGET_S": "120"}, "125"),  # dcgmi diag -r 2: the guard follows the budget
        ({"GPUWARDEN_HEALTH_BUDGET_S": "2.0", "GPUWARDEN_HEALTH_PUBLISH_TIMEOUT_S": "30"}, "35"),
        ({"GPUWARDEN_HEALTH_BUDGET_S": "0.25", "GPUWARDEN_HEALTH_PUBLISH_TIMEOUT_S": ".5"}, "5"),
        ({"GPUWARDEN_HEALTH_BUDGET_S": "120", "GPUWARDEN_HEALTH_WRAPPER_TIMEOUT_S": "600"}, "600"),
        ({"GPUWARDEN_HEALTH_WRAPPER_TIMEOUT_S": "20.5"}, "20.5"),
    ],
)
def test_the_guard_follows_the_budget(rig: Rig, env: dict[str, str], guard: str) -> None:
    rig.result(OK_LINE + "\n", 0)
    p = rig.run(record_timeout=True, **env)
    assert p.returncode == 0 and p.stderr == ""  # no warning
    assert rig.timeout_argv == ["-k", "2", guard, str(rig.gpuwarden), "health-check", "prolog"]
    assert len(rig.log_lines()) == 1


@pytest.mark.parametrize("bad", ["abc", "0", "0.0", "-5", "1e3", "10s", " ", "$(touch pwned)"])
def test_an_invalid_guard_is_logged_and_the_derived_one_used(rig: Rig, bad: str) -> None:
    rig.result(OK_LINE + "\n", 0)
    p = rig.run(record_timeout=True, GPUWARDEN_HEALTH_WRAPPER_TIMEOUT_S=bad)
    assert p.returncode == 0
    assert rig.timeout_argv[:3] == ["-k", "2", "15"]
    ok, *warnings = rig.log_lines()
    assert ok == f"node={NODE} job={JOB} phase=prolog rc=0 {OK_LINE}"  # the checks still ran
    want = f"warning: GPUWARDEN_HEALTH_WRAPPER_TIMEOUT_S='{bad}' is not a positive number of seconds: using 15s"
    assert len(warnings) == 1 and warnings[0].endswith(want), warnings
    assert want in p.stderr
    assert not (rig.dir / "pwned").exists()


def test_an_unreadable_budget_derives_the_guard_from_the_default(rig: Rig) -> None:
    rig.result(OK_LINE + "\n", 0)
    rig.run(record_timeout=True, GPUWARDEN_HEALTH_BUDGET_S="1e3")
    assert rig.timeout_argv[2] == "15"
    assert rig.log_lines()[1].endswith(
        "warning: GPUWARDEN_HEALTH_BUDGET_S='1e3' is not a plain positive number: guard derived from 10 s"
    )


def test_the_env_file_is_parsed_never_executed(rig: Rig) -> None:
    pwn = rig.dir / "pwned"
    rig.env_file.write_text(
        "# gpuwarden health-check settings\n"
        "\n"
        "   # an indented comment\n"
        f"GPUWARDEN_BIN={rig.gpuwarden}\n"
        "GPUWARDEN_HEALTH_FAIL_ON=2 3\n"  # unquoted, with a blank: was `2` and ran the command `3`
        "export GPUWARDEN_HEALTH_EXPECTED_GPUS=8\n"
        'GPUWARDEN_A="double quoted $HOME \\n"\n'
        "GPUWARDEN_B='single quoted \"inner\" $HOME'  \n"
        f"GPUWARDEN_C=$(touch {pwn})\n"
        f"GPUWARDEN_D=`touch {pwn}`; touch {pwn}\n"
        "GPUWARDEN_E=a=b # not a comment\n"
        "GPUWARDEN_F=trailing blanks   \r\n"
        "  GPUWARDEN_G=indented\n"
        "GPUWARDEN_H=\n"
        'GPUWARDEN_I=""\n'
        "GPUWARDEN_DUP=first\n"
        "GPUWARDEN_DUP=last\n"
        f"touch {pwn}\n"
        "lower_case=1\n"
        "GPUWARDEN_J = spaced\n"
        'GPUWARDEN_K="unbalanced\n'
        "GPUWARDEN_L='a' trailing\n"
        "GPUWARDEN_LAST=no newline at the end"
    )
    env = dict(rig.env)
    del env["GPUWARDEN_BIN"]
    rig.env = env
    rig.result("UNKNOWN: xid: no kernel log\n", 3)
    p = rig.run()
    assert not pwn.exists()
    seen = rig.seen_env
    got = {k: v for k, v in seen.items() if k.startswith("GPUWARDEN_") and k not in env}
    assert got == {
        "GPUWARDEN_BIN": str(rig.gpuwarden),  # the wrapper's own settings come from the file too
        "GPUWARDEN_HEALTH_FAIL_ON": "2 3",
        "GPUWARDEN_HEALTH_EXPECTED_GPUS": "8",
        "GPUWARDEN_A": "double quoted $HOME \\n",
        "GPUWARDEN_B": 'single quoted "inner" $HOME',
        "GPUWARDEN_C": f"$(touch {pwn})",
        "GPUWARDEN_D": f"`touch {pwn}`; touch {pwn}",
        "GPUWARDEN_E": "a=b # not a comment",
        "GPUWARDEN_F": "trailing blanks",
        "GPUWARDEN_G": "indented",
        "GPUWARDEN_H": "",
        "GPUWARDEN_I": "",
        "GPUWARDEN_DUP": "last",
        "GPUWARDEN_LAST": "no newline at the end",
    }
    assert "lower_case" not in seen
    # FAIL_ON "2 3" from the file is in force: the UNKNOWN drains
    assert p.returncode == 1
    assert rig.scontrol == rig.drained_with("prolog", "UNKNOWN: xid: no kernel log")
    f = rig.env_file
    warnings = [
        f"{f} line 18 is not KEY=VALUE, skipped: touch {pwn}",
        f"{f} line 19 is not KEY=VALUE, skipped: lower_case=1",
        f"{f} line 20 is not KEY=VALUE, skipped: GPUWARDEN_J = spaced",
        f"{f} line 21 (GPUWARDEN_K): a quoted value must end with its closing quote, skipped",
        f"{f} line 22 (GPUWARDEN_L): a quoted value must end with its closing quote, skipped",
    ]
    log = rig.log_lines()
    assert log[0] == f"node={NODE} job={JOB} phase=prolog rc=3 UNKNOWN: xid: no kernel log"
    assert log[1:] == [f"node={NODE} job={JOB} phase=prolog warning: {w}" for w in warnings]
    for w in warnings:
        assert f"gpuwarden-prolog warning: {w}\n" in p.stderr
        assert ["-t", "gpuwarden-prolog", "--", f"warning: {w}"] in rig.logger


def test_the_callers_environment_wins_over_the_env_file(rig: Rig) -> None:
    rig.env_file.write_text(
        "GPUWARDEN_HEALTH_FAIL_ON=2 3\nGPUWARDEN_HEALTH_EXPECTED_GPUS=8\nGPUWARDEN_X=file\nGPUWARDEN_X=file2\n"
        "PATH=/nonexistent\n"
    )
    rig.result("UNKNOWN: xid: no kernel log\n", 3)
    p = rig.run(GPUWARDEN_HEALTH_FAIL_ON="2", GPUWARDEN_X="", GPUWARDEN_HEALTH_EXPECTED_GPUS="4")
    assert p.returncode == 0 and rig.scontrol == []  # the caller's FAIL_ON=2: UNKNOWN does not fail
    seen = rig.seen_env
    assert seen["GPUWARDEN_HEALTH_EXPECTED_GPUS"] == "4"
    assert seen["GPUWARDEN_X"] == ""  # set, even empty, is the caller's
    assert seen["PATH"] == rig.env["PATH"]


def test_the_env_file_may_set_path_when_the_caller_has_none(rig: Rig) -> None:
    """slurmd starts prologs without PATH: the file's PATH (which finds scontrol) is used."""
    rig.env_file.write_text(f"PATH={rig.bin}:/usr/bin:/bin\n")
    env = dict(rig.env)
    del env["PATH"]
    rig.env = env
    rig.result("CRITICAL: ecc: GPU 0: bad\n", 2)
    p = subprocess.run(["/bin/bash", str(PROLOG)], env=env, capture_output=True, text=True, timeout=20)
    assert p.returncode == 1
    assert rig.scontrol == rig.drained_with("prolog", "CRITICAL: ecc: GPU 0: bad")


def test_a_missing_env_file_is_logged(rig: Rig) -> None:
    rig.result(OK_LINE + "\n", 0)
    missing = rig.dir / "nope.env"
    p = rig.run(GPUWARDEN_HEALTH_ENV_FILE=str(missing))
    assert p.returncode == 0
    assert rig.log_lines()[1].endswith(
        f"warning: env file {missing} is not a readable file; using the environment only"
    )


def test_the_epilog_wrapper_runs_phase_epilog(rig: Rig) -> None:
    line = "CRITICAL: processes: GPU 0: 1 leftover process(es) pid 77 | 9 checks in 0.1s"
    rig.result(line + "\n", 2)
    p = rig.run(script=EPILOG)
    assert p.returncode == 1
    assert rig.argv == ["health-check", "epilog"]
    assert rig.scontrol == rig.drained_with("epilog", line)
    msg = f"node={NODE} job={JOB} phase=epilog rc=2 {line}"
    assert rig.log_lines() == [msg] and rig.logger == [["-t", "gpuwarden-epilog", "--", msg]]


def test_the_phase_comes_from_the_name_or_the_argument(rig: Rig) -> None:
    rig.result(OK_LINE + "\n", 0)
    link = rig.dir / "epilog-site.sh"
    link.symlink_to(PROLOG)
    assert rig.run(script=link).returncode == 0 and rig.argv == ["health-check", "epilog"]
    assert rig.run("epilog").returncode == 0 and rig.argv == ["health-check", "epilog"]
    assert rig.run().returncode == 0 and rig.argv == ["health-check", "prolog"]
    assert rig.run("periodic").returncode == 0 and rig.argv == ["health-check", "run"]
    p = rig.run("bogus")
    assert p.returncode == 2 and "usage:" in p.stderr


def test_a_real_usage_error_is_a_trusted_unknown(rig: Rig) -> None:
    """End to end with the real CLI: a bad option is exit 3 with an ``UNKNOWN:`` line."""
    shim = rig._exe(rig.dir / "gw-bad-option", f'#!/bin/sh\nexec {GPUWARDEN} "$@" --no-such-option\n')
    p = rig.run(GPUWARDEN_BIN=str(shim))
    assert p.returncode == 0 and rig.scontrol == []
    line = "UNKNOWN: gpuwarden health-check prolog: No such option: --no-such-option"
    assert rig.log_lines() == [f"node={NODE} job={JOB} phase=prolog rc=3 {line}"]


# --- gpuwarden health-check: usage errors and --budget are UNKNOWN ---------------------------


@pytest.fixture(scope="module")
def cli() -> object:
    from gpuwarden.shared.cli import app, load_plugins

    load_plugins()
    return app


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["prolog", "--nope"], "UNKNOWN: gpuwarden health-check prolog: No such option: --nope"),
        (["epilog", "extra"], "UNKNOWN: gpuwarden health-check epilog: Got unexpected extra argument(s) (extra)"),
        (["prolog", "--budget", "abc"], "UNKNOWN: gpuwarden health-check prolog: Invalid value for '--budget': "),
        (["nosuch"], "UNKNOWN: gpuwarden health-check: No such command 'nosuch'."),
        (["--nope", "prolog"], "UNKNOWN: gpuwarden health-check: No such option: --nope"),
        (["prolog", "--budget", "0"], "UNKNOWN: --budget 0: Input should be greater than 0"),
        (["prolog", "--budget", "-1"], "UNKNOWN: --budget -1: Input should be greater than 0"),
        (["run", "ecc", "--budget", "7200"], "UNKNOWN: --budget 7200: Input should be less than or equal to 3600"),
        (["prolog", "--gpus", "a,b"], "UNKNOWN: --gpus 'a,b' is not a list of GPU indices"),
    ],
)
def test_cli_usage_errors_are_unknown(cli: object, args: list[str], want: str) -> None:
    from typer.testing import CliRunner

    env = {k: None for k in os.environ if k.startswith("GPUWARDEN_")}
    r = CliRunner().invoke(cli, ["health-check", *args, "--no-publish"], prog_name="gpuwarden", env=env)  # type: ignore[arg-type]
    assert r.exit_code == 3, r.output
    assert r.stdout.startswith(want) and r.stdout.count("\n") == 1, r.stdout
