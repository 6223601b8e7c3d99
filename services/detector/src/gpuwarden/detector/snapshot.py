"""The detector's state file format: tagged JSON (orjson), not pickle.

A snapshot is one JSON object::

    {"format": "gpuwarden-detector-state", "version": 2, "rules": [rule ids...],
     "state": {attribute: value, ...}}

Values are JSON where JSON can say them (``null``, booleans, integers, finite floats, strings,
lists); everything else is an object with one tag key:

=============  ==============================================================================
``$f``         a float JSON has no word for: ``"inf"``, ``"-inf"``, ``"nan"``
``$b``         bytes, base64
``$t``         tuple (``$nt`` + ``$c``: a named tuple of class ``$c``)
``$s``/``$fs`` set / frozenset, as a list
``$d``         dict, as ``[[key, value], ...]`` (keys of any type, order kept);
               ``$dd`` + ``factory``: a ``collections.defaultdict``; ``$cnt``: a ``Counter``
``$dq``        ``collections.deque`` (+ ``maxlen``)
``$o`` + ``$c`` an object of allow-listed class ``$c`` (``module:Qualname``): a dataclass, a
               pydantic model (its field values, rebuilt with ``model_construct``: no validators
               run) or a plain object (its ``__dict__``)
``$e`` + ``$c`` an enum member, by value
``$rule``      a catalog rule, by id: read back as the *current* catalog's rule of that id (the
               file holds state, never the catalog)
``$id``/``$ref`` identity: a mutable object met twice is written once (``$id``) and referred
               to after (``$ref``), so shared references stay shared after a restore
=============  ==============================================================================

Only classes of :data:`ALLOWED_MODULES` (the detector's own package, the message models,
allocations, event-time progress) and the standard containers above can be named: reading a
file never imports or calls anything else, and a file that names another class is refused
with ``ValueError``.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import enum
import importlib
import math
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from pydantic import BaseModel

__all__ = ["ALLOWED_MODULES", "FORMAT", "SnapshotError", "dumps", "loads"]

FORMAT = "gpuwarden-detector-state"

#: Modules whose classes a state file may name (and their submodules, for the detector's package).
ALLOWED_MODULES = (
    "gpuwarden.detector",
    "gpuwarden.shared.models",
    "gpuwarden.shared.allocations",
    "gpuwarden.shared.eventtime",
)

#: ``defaultdict`` factories a file may name.
_FACTORIES: dict[str, Callable[[], Any]] = {"list": list, "set": set, "dict": dict, "int": int, "float": float}


class SnapshotError(ValueError):
    """A state file that is not a detector snapshot of this format (or names a forbidden class)."""


def _allowed(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in ALLOWED_MODULES)


def _class_name(cls: type) -> str:
    if not _allowed(cls.__module__) or "<" in cls.__qualname__:
        raise SnapshotError(f"the detector state holds a {cls.__module__}.{cls.__qualname__}: not a state class")
    return f"{cls.__module__}:{cls.__qualname__}"


def _resolve(name: Any) -> type:
    if not isinstance(name, str) or name.count(":") != 1:
        raise SnapshotError(f"bad class name {str(name)[:100]!r}")
    module, qualname = name.split(":")
    if not _allowed(module):
        raise SnapshotError(f"state file names {module}.{qualname}: not a state class, refused")
    try:
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise SnapshotError(f"state file names {module}.{qualname}, which does not exist: {exc}") from None
    if not isinstance(obj, type):
        raise SnapshotError(f"state file names {module}.{qualname}: not a class, refused")
    return obj


class _Encoder:
    def __init__(self, is_rule: Callable[[Any], str | None]) -> None:
        self.is_rule = is_rule
        self.ids: dict[int, int] = {}
        self.keep: list[Any] = []  # keeps every memoised object alive (ids stay unique)

    def _memo(self, obj: Any) -> dict[str, Any] | int:
        """``{"$ref": n}`` for an object met before, else its new id (an int)."""
        key = id(obj)
        if key in self.ids:
            return {"$ref": self.ids[key]}
        n = self.ids[key] = len(self.ids)
        self.keep.append(obj)
        return n

    def enc(self, obj: Any) -> Any:
        if obj is None or isinstance(obj, bool):
            return obj
        if isinstance(obj, enum.Enum):
            return {"$e": obj.value, "$c": _class_name(type(obj))}
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return float(obj) if math.isfinite(obj) else {"$f": repr(float(obj))}
        if isinstance(obj, str):
            return str(obj)
        if isinstance(obj, bytes):
            return {"$b": base64.b64encode(obj).decode()}
        if isinstance(obj, tuple):
            if hasattr(obj, "_fields"):
                return {"$nt": [self.enc(v) for v in obj], "$c": _class_name(type(obj))}
            return {"$t": [self.enc(v) for v in obj]}
        if isinstance(obj, frozenset):
            return {"$fs": [self.enc(v) for v in obj]}
        rule = self.is_rule(obj)
        if rule is not None:
            return {"$rule": rule}
        n = self._memo(obj)
        if isinstance(n, dict):
            return n
        if type(obj) is list:
            return {"$id": n, "$l": [self.enc(v) for v in obj]}
        if type(obj) is set:
            return {"$id": n, "$s": [self.enc(v) for v in obj]}
        if type(obj) is collections.deque:
            return {"$id": n, "$dq": [self.enc(v) for v in obj], "maxlen": obj.maxlen}
        if isinstance(obj, dict):
            items = [[self.enc(k), self.enc(v)] for k, v in obj.items()]
            if type(obj) is collections.defaultdict:
                factory = next((k for k, f in _FACTORIES.items() if f is obj.default_factory), None)
                if factory is None:
                    raise SnapshotError(f"defaultdict with factory {obj.default_factory!r}: not a state factory")
                return {"$id": n, "$dd": items, "factory": factory}
            if type(obj) is collections.Counter:
                return {"$id": n, "$cnt": items}
            if type(obj) in (dict, collections.OrderedDict):
                return {"$id": n, "$d": items}
        cls = type(obj)
        name = _class_name(cls)
        if isinstance(obj, BaseModel):
            fields = {k: self.enc(getattr(obj, k)) for k in type(obj).model_fields}
            return {"$id": n, "$o": fields, "$c": name, "kind": "model"}
        if dataclasses.is_dataclass(obj):
            fields = {f.name: self.enc(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
            return {"$id": n, "$o": fields, "$c": name, "kind": "dataclass"}
        if hasattr(obj, "__dict__") and not hasattr(cls, "__slots__"):
            return {"$id": n, "$o": {k: self.enc(v) for k, v in vars(obj).items()}, "$c": name, "kind": "object"}
        raise SnapshotError(f"the detector state holds a {cls.__module__}.{cls.__qualname__}: no way to write it")


class _Decoder:
    def __init__(self, rules: Mapping[str, Any]) -> None:
        self.rules = rules
        self.objs: dict[int, Any] = {}

    def _register(self, d: dict[str, Any], obj: Any) -> Any:
        n = d.get("$id")
        if not isinstance(n, int) or n in self.objs:
            raise SnapshotError(f"bad or repeated $id {str(n)[:20]}")
        self.objs[n] = obj
        return obj

    def _pairs(self, items: Any) -> list[tuple[Any, Any]]:
        if not isinstance(items, list) or not all(isinstance(p, list) and len(p) == 2 for p in items):
            raise SnapshotError("a dict is not a list of [key, value] pairs")
        return [(self.dec(k), self.dec(v)) for k, v in items]

    def dec(self, v: Any) -> Any:
        if v is None or isinstance(v, bool | int | float | str):
            return v
        if isinstance(v, list):  # not written by this encoder (lists carry $id), but plain JSON
            return [self.dec(x) for x in v]
        if not isinstance(v, dict):
            raise SnapshotError(f"unexpected JSON value {type(v).__name__}")
        if "$ref" in v:
            try:
                return self.objs[v["$ref"]]
            except (KeyError, TypeError):
                raise SnapshotError(f"$ref {str(v['$ref'])[:20]} to nothing") from None
        if "$f" in v:
            if v["$f"] not in ("inf", "-inf", "nan"):
                raise SnapshotError(f"bad $f {str(v['$f'])[:20]}")
            return float(v["$f"])
        if "$b" in v:
            return base64.b64decode(v["$b"], validate=True)
        if "$t" in v:
            return tuple(self.dec(x) for x in v["$t"])
        if "$nt" in v:
            return _resolve(v["$c"])(*(self.dec(x) for x in v["$nt"]))
        if "$fs" in v:
            return frozenset(self.dec(x) for x in v["$fs"])
        if "$e" in v:
            cls = _resolve(v["$c"])
            if not issubclass(cls, enum.Enum):
                raise SnapshotError(f"{v['$c']} is not an enum")
            return cls(v["$e"])
        if "$rule" in v:
            try:
                return self.rules[v["$rule"]]
            except (KeyError, TypeError):
                raise SnapshotError(f"the state names rule {str(v['$rule'])[:100]!r}, not in the catalog") from None
        if "$l" in v:
            out_l: list[Any] = self._register(v, [])
            out_l.extend(self.dec(x) for x in v["$l"])
            return out_l
        if "$s" in v:
            out_s: set[Any] = self._register(v, set())
            out_s.update(self.dec(x) for x in v["$s"])
            return out_s
        if "$dq" in v:
            maxlen = v.get("maxlen")
            out_q: collections.deque[Any] = self._register(v, collections.deque(maxlen=maxlen))
            out_q.extend(self.dec(x) for x in v["$dq"])
            return out_q
        for tag, make in (("$d", dict), ("$cnt", collections.Counter)):
            if tag in v:
                out_d = self._register(v, make())
                for k, x in self._pairs(v[tag]):
                    out_d[k] = x  # set, not added (Counter.update would count the pairs)
                return out_d
        if "$dd" in v:
            factory = _FACTORIES.get(v.get("factory"))  # type: ignore[arg-type]
            if factory is None:
                raise SnapshotError(f"defaultdict factory {str(v.get('factory'))[:20]!r} refused")
            out_dd: collections.defaultdict[Any, Any] = self._register(v, collections.defaultdict(factory))
            for k, x in self._pairs(v["$dd"]):
                out_dd[k] = x
            return out_dd
        if "$o" in v:
            return self._object(v)
        raise SnapshotError(f"unknown tag in {sorted(v)[:5]}")

    def _object(self, v: dict[str, Any]) -> Any:
        cls: Any = _resolve(v["$c"])
        kind = v.get("kind")
        raw = v["$o"]
        if not isinstance(raw, dict):
            raise SnapshotError(f"{v['$c']}: fields are not an object")
        if kind == "model":
            if not issubclass(cls, BaseModel):
                raise SnapshotError(f"{v['$c']} is not a model")
            # registered before its fields are read (a field may refer back to it); filled after
            obj = self._register(v, cls.model_construct())
            fields = {k: self.dec(x) for k, x in raw.items()}
            unknown = set(fields) - set(cls.model_fields)
            if unknown:
                raise SnapshotError(f"{v['$c']} has no field {sorted(unknown)[:3]}")
            for k, x in fields.items():
                obj.__dict__[k] = x
            obj.__pydantic_fields_set__ = set(fields)
            return obj
        if kind == "dataclass":
            if not dataclasses.is_dataclass(cls):
                raise SnapshotError(f"{v['$c']} is not a dataclass")
            names = {f.name for f in dataclasses.fields(cls)}
        elif kind == "object":
            names = None
        else:
            raise SnapshotError(f"{v['$c']}: unknown object kind {str(kind)[:20]!r}")
        obj = self._register(v, cls.__new__(cls))
        for k, x in raw.items():
            if names is not None and k not in names:
                raise SnapshotError(f"{v['$c']} has no field {k[:100]!r}")
            object.__setattr__(obj, k, self.dec(x))
        return obj


def dumps(rules: list[str], state: dict[str, Any], is_rule: Callable[[Any], str | None]) -> bytes:
    """A snapshot of ``state`` (attribute name -> value) as JSON bytes; ``rules`` are the catalog's
    rule ids it was taken with; ``is_rule(obj)`` gives a catalog rule's id (written by id), else
    None.

    Raises:
        SnapshotError: the state holds an object of a class outside :data:`ALLOWED_MODULES`.
    """
    enc = _Encoder(is_rule)
    body = {"format": FORMAT, "version": VERSION, "rules": rules, "state": {k: enc.enc(x) for k, x in state.items()}}
    return orjson.dumps(body)


#: The format's version (1 was a pickle).
VERSION = 2


def loads(data: bytes, rules: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """(rule ids, state) of a :func:`dumps` snapshot; ``rules`` maps each current catalog rule id
    to its rule (what ``$rule`` reads back as).

    Raises:
        SnapshotError: not JSON, another format or version, or a value this format cannot say
            (a forbidden class, a dangling reference, an unknown rule id).
    """
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise SnapshotError(f"not JSON ({exc}): a state file of an older version (a pickle) or damaged") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise SnapshotError(f"not a {FORMAT} file")
    if body.get("version") != VERSION:
        raise SnapshotError(f"state format version {str(body.get('version'))[:20]}, expected {VERSION}")
    ids, state = body.get("rules"), body.get("state")
    if not isinstance(ids, list) or not isinstance(state, dict):
        raise SnapshotError("no rules or no state")
    dec = _Decoder(rules)
    try:
        return ids, {k: dec.dec(x) for k, x in state.items()}
    except SnapshotError:
        raise
    except (TypeError, ValueError, KeyError) as exc:
        raise SnapshotError(f"unreadable state: {type(exc).__name__}: {str(exc)[:200]}") from None
