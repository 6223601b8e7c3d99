"""The generated documentation (python -m gpuwarden.docgen, make docs) is current, every
setting is documented with its unit, the topic registry names the services that really
produce and consume each topic, and the repository's design pointers resolve."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpuwarden import docgen
from gpuwarden.shared.models import PATTERNS
from gpuwarden.shared.settings import BusSettings, ServiceSettings
from gpuwarden.shared.topics import TOPICS

ROOT = Path(__file__).resolve().parents[2]
ARCH = ROOT / "docs" / "architecture.md"
SERVICE_DIRS = sorted(p.name for p in (ROOT / "services").iterdir() if (p / "pyproject.toml").is_file())


def test_generated_blocks_are_current() -> None:
    assert docgen.generate(ROOT, check=True) == [], "run: python -m gpuwarden.docgen (make docs)"


def test_every_service_readme_has_a_generated_settings_table() -> None:
    assert SERVICE_DIRS, "no services found"
    assert sorted(s.name for s in docgen.SERVICES) == SERVICE_DIRS
    for svc in docgen.SERVICES:
        text = (ROOT / svc.readme).read_text()
        assert text.count("<!-- generated: settings (python -m gpuwarden.docgen)") == 1, svc.readme
        cls = docgen.settings_class(svc)
        own = [n for n in cls.model_fields if n not in svc.base.model_fields]
        assert own, f"{svc.name}: no settings of its own"
        for name in own:  # each own setting is a row of its README
            assert f"`GPUWARDEN_{name.upper()}`" in text, f"{svc.readme} lacks GPUWARDEN_{name.upper()}"


_UNITS = {  # field name suffix -> what its description must name
    "_s": re.compile(r"(\bs\b|\bseconds?\b)"),
    "_ms": re.compile(r"\bms\b"),
    "_mib": re.compile(r"\bMiB\b"),
    "_bytes": re.compile(r"\bbytes\b"),
    "_gbps": re.compile(r"Gb/s"),
}


def _settings_of(owner: str) -> type[BaseSettings]:
    shared: dict[str, type[BaseSettings]] = {"bus": BusSettings, "service": ServiceSettings}
    if owner in shared:
        return shared[owner]
    [svc] = [s for s in docgen.SERVICES if s.name == owner]
    return docgen.settings_class(svc)


@pytest.mark.parametrize("owner", ["bus", "service", *(s.name for s in docgen.SERVICES)])
def test_every_setting_has_a_description_naming_its_unit(owner: str) -> None:
    cls = _settings_of(owner)
    assert cls.model_fields, owner
    for name, info in cls.model_fields.items():
        desc = (info.description or "").strip()
        assert desc, f"{cls.__name__}.{name}: no Field description"
        for suffix, unit in _UNITS.items():
            if name.endswith(suffix):
                assert unit.search(desc), f"{cls.__name__}.{name}: description names no unit ({suffix}): {desc!r}"


def test_moved_settings_classes_are_still_importable_from_service() -> None:
    from gpuwarden.console import service as console_service
    from gpuwarden.console.settings import ConsoleSettings
    from gpuwarden.detector import service as detector_service
    from gpuwarden.detector.settings import DetectorSettings

    assert detector_service.DetectorSettings is DetectorSettings
    assert console_service.ConsoleSettings is ConsoleSettings
    assert "detector_max_ahead_s" in DetectorSettings.model_fields  # the durability settings are mixed in


class _Demo(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUWARDEN_")

    demo_timeout_s: float = Field(2.0, description="How long, s")
    demo_host: str = Field(default_factory=lambda: "this-machine", description="Host")
    demo_named: str = Field(
        default_factory=lambda: "this-machine", description="Named", json_schema_extra={"doc_default": "short hostname"}
    )
    demo_off: bool = Field(False, description="A switch")
    demo_file: Path = Field(Path(tempfile.gettempdir()) / "x.json", description="A temp file")
    demo_none: int | None = Field(None, description="Unset | or <a number>")


def test_default_text_rules() -> None:
    f = _Demo.model_fields
    assert docgen.default_text("demo_timeout_s", f["demo_timeout_s"]) == "`2`"
    assert docgen.default_text("demo_named", f["demo_named"]) == "short hostname"
    assert docgen.default_text("demo_off", f["demo_off"]) == "`false`"
    assert docgen.default_text("demo_file", f["demo_file"]) == "`$TMPDIR/x.json`"
    assert docgen.default_text("demo_none", f["demo_none"]) == "unset"
    with pytest.raises(ValueError, match="demo_host: a default_factory needs"):
        docgen.default_text("demo_host", f["demo_host"])


def test_settings_table_escapes_cells_and_names_variables() -> None:
    class Small(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="GPUWARDEN_")
        demo_none: int | None = Field(None, description="Unset | or <a number>")

    assert docgen.settings_table(Small).splitlines() == [
        "| variable | default | meaning |",
        "|---|---|---|",
        "| `GPUWARDEN_DEMO_NONE` | unset | Unset \\| or &lt;a number&gt; |",
    ]

    class Undocumented(BaseSettings):
        demo_x: int = 1

    with pytest.raises(ValueError, match=r"Undocumented\.demo_x has no Field description"):
        docgen.settings_rows(Undocumented)


def test_replace_block() -> None:
    begin = "<!-- generated: t (python -m gpuwarden.docgen), do not edit by hand -->"
    end = "<!-- end generated: t -->"
    text = f"a\n{begin}\nold\n{end}\nb\n"
    assert docgen.replace_block(text, "t", "new") == f"a\n{begin}\nnew\n{end}\nb\n"
    with pytest.raises(ValueError, match="expected one"):
        docgen.replace_block("no markers", "t", "x")
    with pytest.raises(ValueError, match="expected one"):
        docgen.replace_block(text + begin, "t", "x")
    with pytest.raises(ValueError, match="comes before"):
        docgen.replace_block(f"{end}\n{begin}", "t", "x")


def test_check_mode_reports_a_stale_file_and_writes_nothing(tmp_path: Path) -> None:
    for rel in docgen.blocks():
        dst = tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text((ROOT / rel).read_text())
    stale = tmp_path / "services" / "console" / "README.md"
    text = stale.read_text()
    stale.write_text(text.replace("| `GPUWARDEN_CONSOLE_TOKEN` |", "| `GPUWARDEN_CONSOLE_TOKEM` |"))
    assert docgen.generate(tmp_path, check=True) == ["services/console/README.md"]
    assert "CONSOLE_TOKEM" in stale.read_text()
    assert docgen.main(["--check", "--root", str(tmp_path)]) == 1
    assert docgen.generate(tmp_path) == ["services/console/README.md"]
    assert stale.read_text() == text


def test_topic_registry_names_real_producers_and_consumers() -> None:
    from gpuwarden.console.service import TOPICS as CONSOLE_TOPICS
    from gpuwarden.correlator.core import OUTPUT_TOPICS
    from gpuwarden.detector.lanes import EVENT_LANE, SAMPLE_LANE
    from gpuwarden.otlp_bridge.service import CONSUMED_TOPICS

    for spec in TOPICS.values():
        assert spec.producers, f"{spec.name}: no producer"
        assert set(spec.producers) | set(spec.consumers) <= set(SERVICE_DIRS), spec.name

    def consumers(service: str) -> set[str]:
        return {t.name for t in TOPICS.values() if service in t.consumers}

    def produced(service: str) -> set[str]:
        return {t.name for t in TOPICS.values() if service in t.producers}

    assert produced("correlator") == set(OUTPUT_TOPICS)
    assert consumers("detector") == set(SAMPLE_LANE) | set(EVENT_LANE)
    assert consumers("otlp-bridge") == set(CONSUMED_TOPICS)
    assert consumers("console") == set(CONSOLE_TOPICS)
    assert produced("collector") == {"gpu.samples", "gpu.events"}
    assert produced("slurm-watcher") == {"slurm.jobs", "slurm.nodes", "slurm.watermarks"}


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_architecture_lists_exactly_the_canonical_patterns() -> None:
    names = set(re.findall(r"`([a-z0-9-]+)`", _section(ARCH.read_text(), "Canonical patterns")))
    assert names == set(PATTERNS)


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def _repo_text_files() -> list[Path]:
    out = []
    for pattern in ("*.md", "*.py", "*.yaml", "*.sh"):
        for p in ROOT.rglob(pattern):
            rel = p.relative_to(ROOT).parts
            if rel[0] in {".venv", ".git", "node_modules"} or "__pycache__" in rel:
                continue
            out.append(p)
    return out


def test_no_reference_to_a_design_document_outside_the_repository() -> None:
    files = [p for p in _repo_text_files() if p != Path(__file__).resolve()]  # not this test's own pattern
    assert len(files) > 50
    stale = re.compile(r"DESIGN(\.md)? (section|§)|DESIGN §|section \d+ of DESIGN")
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
            if stale.search(line)]  # fmt: skip
    assert hits == [], f"point into docs/architecture.md instead: {hits}"


def test_links_into_architecture_md_resolve() -> None:
    anchors = {_slug(m) for m in re.findall(r"^#+ (.+)$", ARCH.read_text(), flags=re.M)}
    used = {
        (p.relative_to(ROOT).as_posix(), a)
        for p in _repo_text_files()
        for a in re.findall(r"architecture\.md#([\w-]+)", p.read_text())
    }
    assert used, "nothing points into docs/architecture.md"
    missing = sorted((f, a) for f, a in used if a not in anchors)
    assert missing == [], f"unknown anchors: {missing}"


def test_every_integration_test_module_is_marked_integration() -> None:
    mods = sorted((ROOT / "tests" / "integration").glob("test_*.py"))
    assert mods
    unmarked = [m.name for m in mods if "pytest.mark.integration" not in m.read_text()]
    assert unmarked == [], f"make test-unit would run these: {unmarked}"


def test_relative_links_in_architecture_md_point_at_files_that_exist() -> None:
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", ARCH.read_text())
    assert len(links) > 10
    missing = sorted({ln for ln in links if not (ARCH.parent / ln).exists()})
    assert missing == [], f"docs/architecture.md links to missing files: {missing}"
