"""engines/ray/tasks: a pass's functions reach the workers once, not once per task.

A task function can carry megabytes (the token export's count pass sends the tokenizer's JSON); sent with every
task it is pickled again by the driver and stored again in the object store for each data file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("ray")

from datahub.engines.ray.tasks import map_reduce, map_tasks  # noqa: E402


class _Counted:
    """A callable that appends a line to ``log`` each time the driver pickles it (``__reduce__`` runs only there)."""

    def __init__(self, log: str, fn) -> None:
        self.log, self.fn = log, fn

    def __call__(self, *args):
        return self.fn(*args)

    def __reduce__(self):
        if os.getpid() == int(Path(self.log).read_text().split()[0]):
            with open(self.log, "a") as out:
                out.write("pickled\n")
        return (_Counted, (self.log, self.fn))


def _counted(tmp_path: Path, fn) -> _Counted:
    log = tmp_path / "pickled.log"
    log.write_text(f"{os.getpid()}\n")
    return _Counted(str(log), fn)


def _pickled(fn: _Counted) -> int:
    return Path(fn.log).read_text().count("pickled")


def _square(x: int) -> int:
    return x * x


def _split(x: int) -> tuple[int, list[int]]:
    return x, [x, 10 * x]


def _total(parts: list[int]) -> int:
    return sum(parts)


def test_map_tasks_sends_its_function_once(ray_engine, tmp_path):
    fn = _counted(tmp_path, _square)
    assert list(map_tasks(ray_engine, list(range(12)), fn, workers=2)) == [x * x for x in range(12)]
    assert _pickled(fn) == 1


def test_map_reduce_sends_its_functions_once(ray_engine, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "r").mkdir()
    map_fn, reduce_fn = _counted(tmp_path / "m", _split), _counted(tmp_path / "r", _total)
    smalls, reduced = map_reduce(ray_engine, list(range(8)), map_fn, reduce_fn, partitions=2, workers=2)
    assert smalls == list(range(8)) and reduced == [sum(range(8)), 10 * sum(range(8))]
    assert (_pickled(map_fn), _pickled(reduce_fn)) == (1, 1)
