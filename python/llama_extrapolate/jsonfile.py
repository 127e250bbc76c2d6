"""Result files written so that an interrupted run never leaves a broken one, read back only when they
belong to the run that asks (the resumable benchmarks and evaluations), and written by one run at a time."""

from __future__ import annotations

import fcntl
import functools
import inspect
import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union


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


@contextmanager
def one_writer(path: Union[str, Path]) -> Iterator[None]:
    """Hold ``path``'s lock file (``path`` + ".lock", with the holder's pid) for the block. The resumable runs read
    their file once and rewrite it after every trial, so two runs on one file would each drop the other's trials;
    the second is refused at its start instead. The lock goes with the process, however it ends."""
    path = Path(path)
    lock_path = path.with_name(path.name + ".lock")
    while True:
        try:
            f = open(lock_path, "a+")
        except OSError as e:  # before the run reads anything: the results could not be written either
            raise RuntimeError(f"cannot write results to {path} ({e.strerror}: {lock_path}): make "
                               f"{path.parent} a writable directory, or give another output file") from None
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            raise RuntimeError(f"{path} is being written by another run (pid {holder}): wait for it to end, or give "
                               "this run another output file") from None
        try:
            same = os.fstat(f.fileno()).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a file the previous holder unlinked after we opened it
            break
        f.close()
    try:
        f.truncate(0)
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield
    finally:
        lock_path.unlink(missing_ok=True)
        f.close()


def writes_one_file(param: str) -> Callable:
    """Decorator: the call holds ``one_writer`` on the result file its argument ``param`` names."""

    def wrap(fn: Callable) -> Callable:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            with one_writer(signature.bind(*args, **kwargs).arguments[param]):
                return fn(*args, **kwargs)

        return call

    return wrap
