"""Checked JSON metadata of smerge's own folders (an index's meta.json, an archive's manifest):
reading it as one JSON object, its self-checksum, and short cause texts for damage messages."""

from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING, Callable

from smerge.errors import InputError

if TYPE_CHECKING:
    import pyarrow as pa


def short_error(e: BaseException) -> str:
    """The first line of an error's text, at most 160 characters (for one-line messages)."""
    text = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return text if len(text) <= 160 else text[:157] + "..."


def schema_list(schema: "pa.Schema") -> list[list[str]]:
    """A schema as [[name, type], ...] (how smerge's metadata records it)."""
    return [[f.name, str(f.type)] for f in schema]


def json_digest(meta: dict, field: str) -> str:
    """SHA-256 of ``meta`` without its own checksum ``field`` (canonical JSON: sorted keys)."""
    body = {k: v for k, v in meta.items() if k != field}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_json_object(directory: str, name: str, damaged: Callable[[str, str], InputError]) -> dict:
    """``directory/name`` parsed as one JSON object; anything else is ``damaged(directory, why)``."""
    try:
        with open(os.path.join(directory, name), "rb") as f:
            meta = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise damaged(directory, f"{name} cannot be read ({short_error(e)})") from None
    if not isinstance(meta, dict):
        raise damaged(directory, f"{name} is not a JSON object")
    return meta
