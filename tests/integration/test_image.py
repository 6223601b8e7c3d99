"""Issue 26, item 1: the image builds from ``deploy/Dockerfile`` and runs, with a real engine.

buildah (Debian's package, root, ``--isolation chroot``: no daemon, no OCI runtime) builds
``deploy/Dockerfile`` as it is, both stages: the gpuwarden wheels and the hash-checked wheelhouse
in the first (from PyPI), the install from them with no index in the second. Then, in a container
of the image, as its own user: ``gpuwarden --version`` names every package, the build files are
gone, ``pip check`` finds the locked dependencies consistent, and ``gpuwarden demo`` finds its
fault (embedded broker, simulated Slurm) and exits 0.

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
import re
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

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
# Debian's pip refuses a system-wide install (PEP 668); the official image's does not.
ENV PIP_BREAK_SYSTEM_PACKAGES=1 PIP_CERT=/etc/ssl/certs/ca-certificates.crt LANG=C.UTF-8
CMD ["bash"]
"""


def run(args: list[str], timeout: float, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload,no-any-return]


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
    with tarfile.open(work / "rootfs.tar", "w") as tar:
        tar.add(rootfs, arcname=".")
    shutil.rmtree(rootfs)
    shutil.copyfile(CA_BUNDLE, work / "ca-certificates.crt")
    (work / "Containerfile").write_text(BASE_CONTAINERFILE)
    ok(run(["buildah", "bud", "--isolation", "chroot", "-f", str(work / "Containerfile"), "-t", name, str(work)], 600))
    shutil.rmtree(work)
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
        run(["buildah", "rmi", "--prune"], timeout=120)


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[str]:
    cid = ok(run(["buildah", "from", "--pull=never", image], timeout=120)).strip()
    try:
        yield cid
    finally:
        run(["buildah", "rm", cid], timeout=120)


def in_container(cid: str, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``argv`` in the container as the image's user, its environment and working directory."""
    return run(["buildah", "run", "--isolation", "chroot", cid, "--", *argv], timeout=timeout)


def wheel_versions() -> dict[str, str]:
    """Every gpuwarden package and its version, from the pyprojects the image was built from."""
    out = {}
    for pp in [ROOT / "pyproject.toml", ROOT / "shared" / "pyproject.toml", *ROOT.glob("services/*/pyproject.toml")]:
        text = pp.read_text()
        name = re.search(r'^name\s*=\s*"([^"]+)"', text, re.M)
        version = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M)
        assert name and version, pp
        out[name.group(1)] = version.group(1)
    return out


def test_the_image_runs_as_its_own_user_with_every_package_and_no_build_files(image: str, container: str) -> None:
    config = ok(run(["buildah", "inspect", "--type", "image", "--format",
                     "{{.OCIv1.Config.User}} {{.OCIv1.Config.Cmd}}", image], timeout=60))  # fmt: skip
    assert config.split() == ["gpuwarden", "[gpuwarden", "--help]"], config

    assert ok(in_container(container, "id", "-u")).strip() == "10001"
    version = ok(in_container(container, "gpuwarden", "--version"))
    assert dict(re.findall(r"(gpuwarden(?:-[a-z-]+)?) (\S+)", version)) == wheel_versions(), version
    # the wheels and the wheelhouse were installed and removed; pip finds the dependencies consistent
    assert in_container(container, "test", "-e", "/dist").returncode == 1
    assert in_container(container, "test", "-e", "/wheelhouse").returncode == 1
    ok(in_container(container, "python", "-m", "pip", "check"))
    # every service starts from the image's one command (its help: no Kafka here)
    for service in ("collector", "slurm-watcher", "correlator", "detector", "otlp-bridge", "remediator",
                    "health-check", "console", "topics"):  # fmt: skip
        res = in_container(container, "gpuwarden", service, "--help")
        assert res.returncode == 0 and "Usage" in res.stdout, (service, res.stdout[-1000:], res.stderr[-1000:])


def test_the_demo_runs_in_the_image(container: str) -> None:
    """The image's user has no writable home but /state: the embedded broker was copied out of its
    wheel at build time (CALF_TANSU_BIN), else the demo fails with Permission denied."""
    res = in_container(container, "gpuwarden", "demo", "--no-live", "--report", "/state/report.json", timeout=300)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "1/1 expected found" in res.stdout, res.stdout[-2000:]
    read = "import json; print(json.load(open('/state/report.json'))['score']['passed'])"
    report = ok(in_container(container, "python", "-c", read))
    assert report.strip() == "True"
