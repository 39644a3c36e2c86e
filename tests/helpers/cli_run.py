"""The one CLI test helper: run ``smerge ARGS...`` in this process (``smerge.cli.main.main``) and
return ``(exit code, stdout, stderr)`` as pytest's ``capsys`` captured them."""

from __future__ import annotations

from smerge.cli.main import main


def run_cli(capsys, *args, extra=()):
    rc = main([str(a) for a in args] + list(extra))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


__all__ = ["run_cli"]
