"""Option values converted without pydantic (issue 11's start-up cost).

Typer 0.29 converts every parameter through a pydantic ``TypeAdapter``, built for each of a
command's options while parsing, defaults included: importing pydantic and building the ~35
adapters of ``smerge cgm`` cost about 0.1-0.15 s of every process. smerge's parameters are all
plain ``str``, ``int``, ``float``, ``bool`` or ``list[str]`` (no parser, bounds, choices, paths
or files), so the values Typer hands over almost always convert trivially: a ``str`` stays
itself, the declared defaults are already of their type, a decimal integer or float string
converts with ``int``/``float``. ``install`` makes Typer's parameters do exactly those cases
here and pass everything else (another annotation or any other value, e.g. ``--window 1e3`` or
``--window x``) to Typer's own pydantic route, so results and error messages are Typer's.
``tests/cli/test_coerce.py`` checks the fast results against Typer's adapters.
"""

from __future__ import annotations

import re
from typing import Any

_INT = re.compile(r"-?[0-9]{1,18}")
_FLOAT = re.compile(r"-?[0-9]{1,17}(\.[0-9]{0,17})?([eE]-?[0-9]{1,3})?")
_MISS = object()


def fast_value(annotation: Any, value: Any, *, multi: bool) -> Any:
    """``value`` converted to ``annotation`` as Typer's adapter would, or ``_MISS`` when the
    case is not one of the trivial ones (the caller then uses Typer's own conversion)."""
    if value is None:
        return () if multi else None
    if multi:
        if getattr(annotation, "__origin__", None) is list and annotation.__args__ == (str,) \
                and isinstance(value, (list, tuple)) and all(type(v) is str for v in value):
            return list(value)
        return _MISS
    t = type(value)
    if annotation is str:
        return value if t is str else _MISS
    if annotation is int:
        if t is int:
            return value
        return int(value) if t is str and _INT.fullmatch(value) else _MISS
    if annotation is float:
        if t is float:
            return value
        return float(value) if t is str and _FLOAT.fullmatch(value) else _MISS
    if annotation is bool and t is bool:
        return value
    return _MISS


class _FastRuntimeParam:
    """Stands in for Typer's ``RuntimeParam`` of one plain parameter: converts the trivial
    cases itself, builds Typer's own (pydantic) one for anything else, once."""

    def __init__(self, descriptor, build):
        self.descriptor, self._build, self._typer = descriptor, build, None

    def coerce(self, value: Any, param, ctx) -> Any:
        got = fast_value(self.descriptor.annotation, value, multi=bool(param.multiple or param.nargs == -1))
        if got is not _MISS:
            return got
        if self._typer is None:
            self._typer = self._build(self.descriptor)
        return self._typer.coerce(value, param=param, ctx=ctx)


def _plain(descriptor) -> bool:
    info = descriptor.parameter_info
    return (descriptor.file_annotation is None and getattr(info, "parser", None) is None
            and getattr(info, "min", None) is None and getattr(info, "max", None) is None
            and not getattr(info, "clamp", False) and not descriptor.is_path and not descriptor.is_choice)


def install() -> bool:
    """Route Typer's parameter conversion through ``_FastRuntimeParam`` for plain parameters.
    Returns False (and changes nothing) when this Typer lacks the hooks it relies on."""
    try:
        from typer import _coercion, core
    except ImportError:
        return False
    cls = getattr(core, "_TyperParameter", None)
    build = getattr(_coercion, "build_runtime_param", None)
    if cls is None or build is None or not hasattr(cls, "get_runtime_param"):
        return False
    if getattr(cls.get_runtime_param, "_smerge_fast", False):
        return True
    typer_get = cls.get_runtime_param

    def get_runtime_param(self):
        if getattr(self, "_runtime_param", None) is None:
            desc = getattr(self, "type_descriptor", None)
            if desc is None or not _plain(desc):
                return typer_get(self)
            self._runtime_param = _FastRuntimeParam(desc, build)
        return self._runtime_param

    get_runtime_param._smerge_fast = True
    cls.get_runtime_param = get_runtime_param
    return True


__all__ = ["fast_value", "install"]
