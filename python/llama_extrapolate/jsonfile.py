"""Result files written so that an interrupted run never leaves a broken one, and read back only when they
belong to the run that asks (the resumable benchmarks and evaluations)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Optional, Union


def write_json_atomic(path: Union[str, Path], data: Any, indent: Optional[int] = None) -> None:
    """Write ``data`` as JSON next to ``path`` and rename it over: a run killed mid-write leaves the old,
    valid file, which a rerun resumes from."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=indent))
    os.replace(tmp, path)


def read_json_if(path: Union[str, Path], same: Callable[[dict], bool]) -> dict:
    """The JSON object at ``path`` when it exists, parses and ``same(it)`` says it belongs to this run, else {}:
    a rerun resumes its own results and starts afresh over anyone else's."""
    path = Path(path)
    if not path.exists():
        return {}
    try:
        old = json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}
    return old if isinstance(old, dict) and same(old) else {}
