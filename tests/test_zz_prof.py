import time, sys
import pytest
from tests.conftest import tiny_config
pytestmark = [pytest.mark.ray, pytest.mark.slow]

def test_prof(small_data, tmp_path):
    from raybiphase.pretrain.trainer import run_pretrain
    import ray.cloudpickle
    sys.path.insert(0, "/tmp/lazyentry")
    import lazy_entry
    ray.cloudpickle.register_pickle_by_value(lazy_entry)
    for i in range(6):
        fn = lazy_entry.train_loop if i % 2 else None
        t = time.time()
        run_pretrain(tiny_config(tmp_path / str(i), small_data, **{"resources.num_workers": 1, "train.eval_every": 4}), train_fn=fn)
        print("fit", "lazy" if fn else "prod", round(time.time() - t, 2))
