"""README.md's table of ``gpuwarden parse`` kinds against the registered parsers (entry points
``gpuwarden.parsers``): the same kinds, the same functions, and no version in the table that the
parser's own docstring (or the docstring of its module or of a function it refers to) does not name."""

from __future__ import annotations

import importlib
import inspect
import re
from importlib.metadata import entry_points
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
VERSION = re.compile(r"\bv?\d+(?:\.\d+)*(?:\.x)?")


def table() -> dict[str, dict[str, str]]:
    """kind -> {tool, versions, returns, parser} from the README's marked table."""
    text = README.read_text()
    m = re.search(r"<!-- parse-kinds:start -->\n(.*?)<!-- parse-kinds:end -->", text, re.S)
    assert m, "README.md has no <!-- parse-kinds:start --> ... <!-- parse-kinds:end --> table"
    rows: dict[str, dict[str, str]] = {}
    for line in m.group(1).splitlines()[2:]:  # header, separator
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 5, line
        kind = cells[0].strip("`")
        assert kind not in rows, f"{kind} twice"
        rows[kind] = dict(zip(("tool", "versions", "returns", "parser"), cells[1:], strict=True))
        rows[kind]["parser"] = rows[kind]["parser"].strip("`")
    return rows


def docs(target: str) -> str:
    """The parser's docstring, its module's, and those of functions it names (:func:`x`)."""
    mod_name, fn_name = target.split(":")
    fn = getattr(importlib.import_module(mod_name), fn_name)
    mod = inspect.getmodule(fn)  # where it is defined (a package may re-export it)
    assert mod is not None
    own = inspect.getdoc(fn) or ""
    parts = [own, inspect.getdoc(mod) or ""]
    for ref in re.findall(r":func:`~?([\w.]+)`", own):
        obj = getattr(mod, ref.rsplit(".", 1)[-1], None)
        if obj is not None and inspect.getmodule(obj) is not None:
            parts += [inspect.getdoc(obj) or "", inspect.getdoc(inspect.getmodule(obj)) or ""]
    return " ".join(" ".join(parts).split())


def test_the_table_lists_every_registered_kind_and_its_function() -> None:
    registered = {ep.name: ep.value for ep in entry_points(group="gpuwarden.parsers")}
    rows = table()
    assert sorted(rows) == sorted(registered), set(rows) ^ set(registered)
    assert list(rows) == sorted(rows)  # the order `gpuwarden parse --help` shows (cli.py sorts by name)
    for kind, row in rows.items():
        assert row["parser"] == registered[kind], kind


def test_every_version_in_the_table_is_one_the_parser_names() -> None:
    for kind, row in table().items():
        found = VERSION.findall(row["versions"])
        assert found, f"{kind}: the versions cell names no version"
        doc = docs(row["parser"])
        for v in found:
            if v in {"8"}:  # "8x A100": a count, not a version
                continue
            assert v in doc, f"{kind}: {v} is not in the docstring of {row['parser']}"


def test_a_wrong_version_is_caught() -> None:
    """The check above can fail: a version the parser does not claim is not in its docs."""
    assert "9.99" not in docs("gpuwarden.shared.nvidia.smi_xml:parse_nvidia_smi_xml")
    assert "v13" in docs("gpuwarden.shared.nvidia.smi_xml:parse_nvidia_smi_xml")
