"""The internals of Ray this platform reaches (raybiphase.ray_internals): present in the Ray it installs, and a Ray
that moved one is refused in one line before anything starts, never silently worked around."""

from __future__ import annotations

import pytest

from raybiphase import ray_internals
from raybiphase.errors import UserError


def test_the_installed_ray_has_every_internal_this_code_reaches():
    assert ray_internals.missing() == []
    ray_internals.check()
    running, recorded = ray_internals.local_clusters()
    assert isinstance(running, list) and isinstance(recorded, str)


def test_a_ray_without_the_workers_execute_is_refused_in_one_line(monkeypatch):
    class MovedWorker:  # a Ray Train worker class whose main-thread hook went elsewhere
        pass

    monkeypatch.setattr(ray_internals, "_train_worker_class", lambda: MovedWorker)
    with pytest.raises(UserError) as error:
        ray_internals.check()
    line = str(error.value)
    assert "\n" not in line and "RayTrainWorker.execute" in line and ray_internals.TESTED_RAY in line


def test_a_ray_whose_internal_module_moved_is_refused_naming_it(monkeypatch):
    def moved():
        raise ImportError("No module named 'ray.train.v2._internal.execution.worker_group.worker'")

    monkeypatch.setattr(ray_internals, "_train_worker_class", moved)
    assert ray_internals.missing() == ["ray.train.v2._internal.execution.worker_group.worker.RayTrainWorker"]
