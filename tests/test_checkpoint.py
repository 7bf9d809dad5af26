"""Checkpoint loading never unpickles arbitrary objects."""

import os
import pickle

import pytest

from raybiphase.pretrain.checkpoint import SafeReader


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_metadata_with_a_foreign_global_is_refused(tmp_path):
    (tmp_path / ".metadata").write_bytes(pickle.dumps(_Exploit()))
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        SafeReader(str(tmp_path)).read_metadata()
