"""``GpuSample``'s fields generated from the field registry (``fields.csv``).

``python -m gpuwarden.shared.fieldgen`` rewrites, in ``gpuwarden/shared/models.py``, the field
block of :class:`~gpuwarden.shared.models.GpuSample` between the marker comments::

    # generated: fields.csv (python -m gpuwarden.shared.fieldgen), list fields by hand
    ...
    # end generated: fields.csv

one declaration per registry row, in file order. A scalar row (``float``, ``int``, ``bool``,
``str``) becomes ``name: <type> | None = Field(None, ge=..., le=..., description=...)`` from its
``type``, ``str_kind``, ``ge``, ``le`` and ``description`` (the GPU key ``index`` is required);
a ``list`` row keeps the declaration written by hand in the block (nested values are code),
moved to the row's position. ``--check`` writes nothing and exits 1 when the block is stale
(``tests/unit/test_fields_registry.py`` does the same).

:func:`gpu_sample_model` builds the class a registry *would* generate (another CSV of the same
columns, e.g. a copy with one more row in a test) without writing anything.
"""

from __future__ import annotations

import argparse
import ast
import functools
import sys
from collections.abc import Sequence
from pathlib import Path

from . import models
from .fields import FIELDS, KEY_FIELD, FieldSpec

__all__ = ["BEGIN", "END", "block", "generate", "gpu_sample_model", "main", "render_field", "rewrite"]

BEGIN = "    # generated: fields.csv (python -m gpuwarden.shared.fieldgen), list fields by hand"
END = "    # end generated: fields.csv"
#: ``ruff format``'s line length (``pyproject.toml``): a declaration is laid out as ruff would.
LINE_LENGTH = 120
_PY_TYPE = {"float": "float", "int": "Int64", "bool": "bool", "str": "str"}
_STR_TYPE = {"token": "Token", "text": "Text", "": "str"}


def render_field(f: FieldSpec) -> str:
    """The declaration of a scalar row, laid out as ``ruff format`` lays it out (one line, or
    ``Field(`` with its arguments on the next line).

    Raises:
        ValueError: a list row, a bound that is no number nor constant of
            :mod:`gpuwarden.shared.models`, or a description too long to fit one line.
    """
    if f.type == "list":
        raise ValueError(f"{f.field}: a list field is written by hand")
    for b in (f.ge, f.le):
        if b and not b[0].isdigit() and b[0] != "-" and not isinstance(getattr(models, b, None), int | float):
            raise ValueError(f"{f.field}: bound {b!r} is not a number constant of gpuwarden.shared.models")
    key = f.field == KEY_FIELD
    # the key is not optional: its own bounds (models.Int64 would override them)
    py = _STR_TYPE[f.str_kind] if f.type == "str" else "int" if key and f.type == "int" else _PY_TYPE[f.type]
    args = [] if key else ["None"]
    args += [f"ge={f.ge}"] * bool(f.ge) + [f"le={f.le}"] * bool(f.le)
    args += [f'description="{f.description}"'] * bool(f.description)
    ann = py if key else f"{py} | None"
    if args == ["None"]:
        return f"    {f.field}: {ann} = None"
    inner = ", ".join(args)
    one = f"    {f.field}: {ann} = Field({inner})"
    if len(one) <= LINE_LENGTH:
        return one
    if len(inner) + 8 > LINE_LENGTH:
        raise ValueError(f"{f.field}: description too long for one line ({len(inner) + 8} > {LINE_LENGTH} characters)")
    return f"    {f.field}: {ann} = Field(\n        {inner}\n    )"


def _class_span(text: str) -> tuple[int, int]:
    """Line indexes (0-based) of the BEGIN and END markers in ``text``."""
    lines = text.splitlines()
    try:
        return lines.index(BEGIN), lines.index(END)
    except ValueError:
        raise ValueError("models.py: the GpuSample field block markers are missing") from None


def _hand_written(text: str) -> dict[str, str]:
    """Field name -> the source lines of each declaration in the block of ``text``."""
    lines = text.splitlines()
    start, end = _class_span(text)
    body = "\n".join(line[4:] for line in lines[start + 1 : end])
    out: dict[str, str] = {}
    body_lines = body.splitlines()
    for node in ast.parse(body).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            seg = body_lines[node.lineno - 1 : node.end_lineno]
            out[node.target.id] = "\n".join("    " + s if s else s for s in seg)
    return out


def block(fields: Sequence[FieldSpec], text: str) -> str:
    """The field block (markers included) for ``fields``, taking the list fields' declarations
    from the block of ``text`` (the current ``models.py``).

    Raises:
        ValueError: a list row without a declaration written by hand in the block; a row that
            :func:`render_field` refuses.
    """
    hand = _hand_written(text)
    out = [BEGIN]
    for f in fields:
        if f.type == "list":
            if f.field not in hand:
                raise ValueError(f"fields.csv: list field {f.field} needs its declaration written in GpuSample")
            out.append(hand[f.field])
        else:
            out.append(render_field(f))
    out.append(END)
    return "\n".join(out)


def rewrite(fields: Sequence[FieldSpec], text: str) -> str:
    """``text`` (``models.py``) with the GpuSample field block regenerated from ``fields``."""
    start, end = _class_span(text)
    lines = text.splitlines(keepends=True)
    return "".join(lines[:start]) + block(fields, text) + "\n" + "".join(lines[end + 1 :])


def _models_path() -> Path:
    return Path(models.__file__)


@functools.cache
def _model_for(fields: tuple[FieldSpec, ...]) -> type[models.GpuSample]:
    text = _models_path().read_text(encoding="utf-8")
    lines = block(fields, text).splitlines()
    doc = models.GpuSample.__doc__ or ""
    src = "class GpuSample(GpuSample):\n" + f"    {doc!r}\n" + "\n".join(lines[1:-1]) + "\n"
    namespace = dict(vars(models))
    exec(compile(src, f"<GpuSample from {len(fields)} fields.csv rows>", "exec"), namespace)
    cls: type[models.GpuSample] = namespace["GpuSample"]
    return cls


def gpu_sample_model(fields: Sequence[FieldSpec] = FIELDS) -> type[models.GpuSample]:
    """The ``GpuSample`` class that ``fields`` generate: :class:`~gpuwarden.shared.models.GpuSample`
    itself for the shipped registry, else the fields the generator would write, compiled in
    :mod:`gpuwarden.shared.models`'s namespace as a subclass of ``GpuSample`` (so its instances
    go wherever a ``GpuSample`` goes: a ``NodeSample``, the readers, the bridge's store). Rows
    the shipped registry lacks come after its fields; a row left out of ``fields`` stays
    (inherited). Cached per registry.

    Raises:
        ValueError: as :func:`block`.
    """
    if fields is FIELDS:
        return models.GpuSample
    fields = tuple(fields)
    if fields == FIELDS:
        return models.GpuSample
    return _model_for(fields)


def generate(check: bool = False, path: Path | None = None) -> bool:
    """Regenerate the GpuSample field block of ``models.py`` (or ``path``) from the shipped
    registry. Returns whether the file was (``check``: would be) changed; ``check`` writes nothing."""
    path = path or _models_path()
    text = path.read_text(encoding="utf-8")
    new = rewrite(FIELDS, text)
    if new == text:
        return False
    if not check:
        _compiles(new, path)
        path.write_text(new, encoding="utf-8")
    return True


def _compiles(text: str, path: Path) -> None:
    """Refuse to write a ``models.py`` that would not import (every ``gpuwarden`` import, this
    generator's included, would fail until the file is restored by hand): the whole file must
    compile and the generated ``GpuSample`` block must build as a model.

    Raises:
        ValueError: what Python or pydantic said, nothing written.
    """
    try:
        compile(text, str(path), "exec")
        lines = block(FIELDS, text).splitlines()
        src = "class GpuSample(Model):\n" + "\n".join(lines[1:-1]) + "\n"
        exec(compile(src, "<generated GpuSample>", "exec"), dict(vars(models)))
    except Exception as exc:  # any failure: the file must not be written
        raise ValueError(
            f"{path}: not written, the generated GpuSample would not import: {type(exc).__name__}: {exc}"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gpuwarden.shared.fieldgen [--check]``: 0 when current (or rewritten), 1 when
    ``--check`` finds the block stale, 2 when the registry cannot be written (nothing written).
    It rewrites the ``models.py`` of the ``gpuwarden.shared`` it imports (printed): run it with
    the checkout's own environment."""
    ap = argparse.ArgumentParser(prog="python -m gpuwarden.shared.fieldgen", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when models.py is stale")
    args = ap.parse_args(argv)
    try:
        changed = generate(check=args.check)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    where = _models_path()
    if args.check and changed:
        print(f"{where}: GpuSample differs from fields.csv; run python -m gpuwarden.shared.fieldgen", file=sys.stderr)
        return 1
    print(f"{where}: {'rewritten' if changed else 'current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
