"""Readable help: usage lines and value names as a person writes them.

Typer 0.29 shows every value by its Python type (``--window <int>``, ``--keys <str>``, an
argument as ``{a} <str>``). ``readable(command)`` gives each option a value name that says what
to write (``--window N``, ``--keys K1,K2``, ``--conf KEY=VALUE``) and each argument its name
in capitals, as Click and most Unix tools do: ``smerge cgm [OPTIONS] A B``.
"""

from __future__ import annotations

from typing import Any

# Value names of the options shared by several commands (any other option: its name in capitals).
VALUE_NAMES = {
    "--keys": "K1,K2", "--keys-b": "K1,K2", "--vars-a": "V1,V2", "--vars-b": "V1,V2", "--vars": "[I=]V1,V2",
    "--eps": "EPS", "--window": "N", "--increment": "K", "--increment-a": "K", "--increment-b": "K",
    "--output": "PATH", "--format": "FORMAT", "--unmatched": "PREFIX", "--stats": "PATH", "--summary": "PATH",
    "--plot": "PATH", "--delta": "D", "--delta-windows": "M", "--master": "URL", "--partitions": "P",
    "--conf": "KEY=VALUE", "--nan-keys": "error|unmatched", "--time": "COL", "--item": "COL", "--on": "COLS",
    "--where": "EXPR", "--pair-window": "I,J=DUR", "--every": "DUR", "--from": "TIME", "--to": "TIME",
    "--records": "N", "--randomize": "PCT", "--seed": "S", "--jitter": "X", "--grid": "NLAT,NLON",
    "--displacement": "D", "--server": "URL", "--token-file": "FILE", "--host": "HOST", "--port": "PORT",
    "--index": "DIR", "--refill": "page|symdiff", "--sample": "F|auto", "--sample-a": "F", "--sample-b": "F",
    "--budget": "SECONDS", "--layout": "randomize-then-sort|eager", "--copies": "F1,F2",
    "--aggregate": "EVERY:FUNCS[:BY]", "--run-blocks": "R", "--block-rows": "B", "--lifetime": "DUR",
    "--support": "LAMBDA", "--correct-factor": "C", "--sketch": "HxM", "--max-frequent": "F",
}


def _value_name(param: Any) -> str:
    longs = [o for o in param.opts if o.startswith("--")]
    for o in longs:
        if o in VALUE_NAMES:
            return VALUE_NAMES[o]
    name = (longs[0] if longs else param.opts[0]).lstrip("-")
    return name.upper().replace("-", "_")


def _argument_usage(param: Any) -> str:
    name = param.metavar
    if param.nargs != 1:
        name += "..."
    return name if param.required else f"[{name}]"


def readable(command: Any) -> Any:
    """Set the value names of ``command`` (a Click command or group) and of its subcommands."""
    for sub in getattr(command, "commands", {}).values():
        readable(sub)
    for param in getattr(command, "params", ()):
        if getattr(param, "param_type_name", "") == "argument":
            if param.metavar is None:
                param.metavar = param.name.upper()
            # the name alone: no Python type beside it, no braces in the usage line
            param.display_type_rich = lambda ctx=None: None
            param._usage_display_name = lambda p=param: _argument_usage(p)
        elif getattr(param, "param_type_name", "") == "option" and not param.is_flag and param.metavar is None:
            param.metavar = _value_name(param)
    return command


__all__ = ["VALUE_NAMES", "readable"]
