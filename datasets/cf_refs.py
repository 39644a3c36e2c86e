"""CF attributes that name other variables: read the names, and rename or drop them.

CF 1.8 attributes whose values are variable names: ``coordinates``, ``bounds``,
``climatology`` and ``ancillary_variables`` (blank-separated names); ``cell_measures`` and
``formula_terms`` (``"key: name key: name"``); ``grid_mapping`` (``"crs"`` or the extended
``"crs: lat lon crs2: x y"``). A file that references a variable it does not hold is broken
for CF tools (xarray raises or warns), so writers rename the references to the names they
write and drop the ones they cannot honour. Pure string handling: no netCDF library here.
"""

from __future__ import annotations

from typing import Callable

NAME_LIST_ATTRS = ("coordinates", "bounds", "climatology", "ancillary_variables")
PAIR_ATTRS = ("cell_measures", "formula_terms")
REFERENCE_ATTRS = NAME_LIST_ATTRS + PAIR_ATTRS + ("grid_mapping",)

Rename = Callable[[str], "str | None"]


def references(attr: str, value: object) -> list[str]:
    """The variable names ``value`` of attribute ``attr`` references (in order; [] if none)."""
    if attr not in REFERENCE_ATTRS or not isinstance(value, str):
        return []
    toks = value.split()
    if attr in NAME_LIST_ATTRS:
        return toks
    if attr in PAIR_ATTRS:
        return [t for t in toks if not t.endswith(":")]
    return [t[:-1] if t.endswith(":") else t for t in toks]  # grid_mapping: mappings and their coordinates


def rename_references(attr: str, value: object, rename: Rename) -> object | None:
    """``value`` with every referenced name ``n`` replaced by ``rename(n)``, dropping the names
    for which it returns None. None when nothing is left (drop the attribute). Values that are
    not strings, and attributes that name no variables, are returned unchanged.

    ``formula_terms`` is all or nothing: a formula with a missing term is dropped whole.
    ``grid_mapping``: a mapping that is dropped takes its coordinate list with it.
    """
    if attr not in REFERENCE_ATTRS or not isinstance(value, str):
        return value
    toks = value.split()
    if attr in NAME_LIST_ATTRS:
        out: list[str] = []
        for t in toks:
            r = rename(t)
            if r is not None and r not in out:
                out.append(r)
        return " ".join(out) or None
    if attr in PAIR_ATTRS:
        pairs = _pairs(toks)
        kept = [(k, rename(n)) for k, n in pairs]
        if attr == "formula_terms" and any(n is None for _, n in kept):
            return None
        return " ".join(f"{k} {n}" for k, n in kept if n is not None) or None
    # grid_mapping
    if not any(t.endswith(":") for t in toks):
        out = [r for r in (rename(t) for t in toks) if r is not None]
        return " ".join(out) or None
    groups: list[str] = []
    for mapping, coords in _groups(toks):
        m = rename(mapping)
        if m is None:
            continue
        cs = [r for r in (rename(c) for c in coords) if r is not None]
        if coords and not cs:
            continue
        groups.append(" ".join([f"{m}:"] + cs))
    return " ".join(groups) or None


def _pairs(toks: list[str]) -> list[tuple[str, str]]:
    out, key = [], None
    for t in toks:
        if t.endswith(":"):
            key = t
        elif key is not None:
            out.append((key, t))
            key = None
    return out


def _groups(toks: list[str]) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for t in toks:
        if t.endswith(":"):
            out.append((t[:-1], []))
        elif out:
            out[-1][1].append(t)
    return out


__all__ = ["REFERENCE_ATTRS", "references", "rename_references"]
