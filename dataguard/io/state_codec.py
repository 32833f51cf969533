"""A data format for resume state: JSON with typed tags, never pickle.

Resume state lives in the output folder, which other people may be able to write to.
Unpickling it would run whatever code a crafted file names, so per-unit metadata (counts,
stage stats, fit summaries) is stored as JSON that can only ever decode into plain data:
numbers, strings, containers, numpy arrays (raw bytes + dtype, no object arrays of code)
and dataclasses *defined inside dataguard* (rebuilt field by field, no ``__reduce__``).

Anything else fails loudly at *encode* time, so a stage author learns at once that a new
summary type needs to be plain data.
"""

from __future__ import annotations

import base64
import dataclasses
import importlib
import json
import math
from collections import Counter
from typing import Any

import numpy as np

FORMAT = "dataguard-state/1"
_TRUSTED_PREFIX = "dataguard."
# Object arrays hold Python values (ids, texts); everything else is stored as raw bytes.
_RAW_KINDS = "biufcmMSU"


class StateFormatError(ValueError):
    """A resume-state file is not valid dataguard state (corrupt or crafted)."""


def dumps(value: Any) -> bytes:
    """Encode ``value`` as UTF-8 JSON bytes (deterministic: sorted keys, no spaces)."""
    doc = {"format": FORMAT, "value": _encode(value)}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def loads(data: bytes) -> Any:
    """Decode what :func:`dumps` wrote; raise :class:`StateFormatError` for anything else."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise StateFormatError(f"not a dataguard state file: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or "value" not in doc:
        raise StateFormatError(f"not a dataguard state file (expected format {FORMAT!r})")
    try:
        return _decode(doc["value"])
    except StateFormatError:
        raise
    except (KeyError, TypeError, ValueError, RecursionError) as exc:
        raise StateFormatError(f"corrupt dataguard state: {type(exc).__name__}: {exc}") from None


def _encode(v: Any) -> Any:
    if v is None or isinstance(v, bool | str):
        return v
    if isinstance(v, int) and not isinstance(v, np.integer):
        return v
    if isinstance(v, float) and not isinstance(v, np.floating):
        return v if math.isfinite(v) else {"$float": repr(v)}
    if isinstance(v, np.ndarray):
        return _encode_array(v)
    if isinstance(v, np.generic):
        return {"$np": str(v.dtype), "v": _encode(v.item())}
    if isinstance(v, bytes):
        return {"$bytes": base64.b64encode(v).decode("ascii")}
    if isinstance(v, Counter):
        return {"$counter": [[_encode(k), _encode(x)] for k, x in v.items()]}
    if isinstance(v, dict):
        return {"$dict": [[_encode(k), _encode(x)] for k, x in v.items()]}
    if isinstance(v, list):
        return [_encode(x) for x in v]
    if isinstance(v, tuple):
        return {"$tuple": [_encode(x) for x in v]}
    if isinstance(v, set | frozenset):
        items = sorted((_encode(x) for x in v), key=lambda e: json.dumps(e, sort_keys=True))
        return {"$set": items, "frozen": isinstance(v, frozenset)}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        cls = type(v)
        name = f"{cls.__module__}.{cls.__qualname__}"
        if not name.startswith(_TRUSTED_PREFIX):
            raise TypeError(f"resume state may only hold dataguard dataclasses, not {name}")
        return {"$dc": name, "fields": {f.name: _encode(getattr(v, f.name)) for f in dataclasses.fields(v)}}
    raise TypeError(f"resume state cannot hold a {type(v).__module__}.{type(v).__qualname__}; "
                    "summaries and stats must be plain data (numbers, strings, containers, numpy arrays)")


def _encode_array(a: np.ndarray) -> dict[str, Any]:
    if a.dtype.kind in _RAW_KINDS:
        data = np.ascontiguousarray(a)
        return {"$nd": data.dtype.str, "shape": list(a.shape),
                "b64": base64.b64encode(data.tobytes()).decode("ascii")}
    if a.dtype.kind == "O":
        return {"$ndobj": list(a.shape), "items": [_encode(x) for x in a.ravel().tolist()]}
    raise TypeError(f"resume state cannot hold a numpy array of dtype {a.dtype}")


def _decode(e: Any) -> Any:
    if e is None or isinstance(e, bool | int | float | str):
        return e
    if isinstance(e, list):
        return [_decode(x) for x in e]
    if not isinstance(e, dict):
        raise StateFormatError(f"unexpected JSON value {type(e).__name__}")
    if "$dict" in e:
        return {_decode(k): _decode(x) for k, x in e["$dict"]}
    if "$counter" in e:
        return Counter({_decode(k): _decode(x) for k, x in e["$counter"]})
    if "$tuple" in e:
        return tuple(_decode(x) for x in e["$tuple"])
    if "$set" in e:
        items = [_decode(x) for x in e["$set"]]
        return frozenset(items) if e.get("frozen") else set(items)
    if "$float" in e:
        text = e["$float"]
        if text not in ("nan", "inf", "-inf"):
            raise StateFormatError(f"bad special float {text!r}")
        return float(text)
    if "$bytes" in e:
        return base64.b64decode(e["$bytes"], validate=True)
    if "$np" in e:
        return np.dtype(_plain_dtype(e["$np"])).type(_decode(e["v"]))
    if "$nd" in e:
        dtype = _plain_dtype(e["$nd"])
        shape = tuple(int(n) for n in e["shape"])
        raw = base64.b64decode(e["b64"], validate=True)
        return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
    if "$ndobj" in e:
        items = [_decode(x) for x in e["items"]]
        out = np.empty(len(items), dtype=object)
        out[:] = items
        return out.reshape(tuple(int(n) for n in e["$ndobj"]))
    if "$dc" in e:
        return _decode_dataclass(e["$dc"], e["fields"])
    raise StateFormatError(f"unknown tag in state: {sorted(e)[:3]}")


def _plain_dtype(text: str) -> np.dtype:
    dtype = np.dtype(text)
    if dtype.kind not in _RAW_KINDS or dtype.hasobject:
        raise StateFormatError(f"dtype {text!r} is not allowed in resume state")
    return dtype


def _decode_dataclass(name: str, fields: dict[str, Any]) -> Any:
    """Rebuild a dataguard dataclass by setting its fields: no constructor logic, no code by name."""
    if not isinstance(name, str) or not name.startswith(_TRUSTED_PREFIX) or not isinstance(fields, dict):
        raise StateFormatError(f"state names an untrusted type {name!r}")
    module_name, _, qualname = name.rpartition(".")
    module = _dataguard_module(module_name)
    cls: Any = module
    for part in qualname.split("."):
        cls = getattr(cls, part, None)
    if cls is None or not isinstance(cls, type) or not dataclasses.is_dataclass(cls):
        raise StateFormatError(f"state names {name!r}, which is not a dataguard dataclass")
    known = {f.name for f in dataclasses.fields(cls)}
    if set(fields) != known:
        raise StateFormatError(f"state for {name!r} has fields {sorted(fields)}, expected {sorted(known)}")
    obj = object.__new__(cls)
    for key, value in fields.items():
        object.__setattr__(obj, key, _decode(value))
    return obj


def _dataguard_module(name: str) -> Any:
    """Import a module of this package by name (never anything outside ``dataguard``)."""
    if not name.startswith(_TRUSTED_PREFIX) or not all(p.isidentifier() for p in name.split(".")):
        raise StateFormatError(f"state names an untrusted module {name!r}")
    try:
        return importlib.import_module(name)
    except ImportError:
        raise StateFormatError(f"state names an unknown module {name!r}") from None
