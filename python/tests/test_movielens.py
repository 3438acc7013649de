"""examples/torch_movielens.py, the click-through model on MovieLens-100k with one sparse
table (leash.torch.SparseEmbedding) and dense layers on top, trained by two Python
workers against two shards: every training sample of every epoch is trained once, and the
test AUC is far above chance (0.5) after two epochs (0.78-0.79 measured, as the PyTorch
twin bench/torch_ctr.py reaches)."""
import json
import os

import pytest

from conftest import ROOT

pytest.importorskip("torch")
DATA = "/usr/local/share/leash/datasets/ml-100k"
if not os.path.exists(os.path.join(DATA, "ml-100k.inter")):
    pytest.skip(f"MovieLens-100k is not in {DATA} (scripts/fetch-movielens.sh)",
                allow_module_level=True)
EXAMPLE = os.path.join(ROOT, "examples", "torch_movielens.py")


def test_two_python_workers_on_two_shards_learn_click_through(cluster2, workers, tmp_path):
    ps = [workers.python(f"w{i}", EXAMPLE, f"--servers={cluster2.servers}", f"--name=w{i}",
                         "--epochs=2", f"--metrics-out={tmp_path}/w{i}.json")
          for i in range(2)]
    for p in ps:
        assert p.wait(timeout=240) == 0, workers.log(p)
    w = []
    for i in range(2):
        with open(tmp_path / f"w{i}.json") as f:
            w.append(json.load(f))
    # On a failure, everything a rare bad run leaves to look at: both workers' epochs and
    # transport counters, and what the shards warned about.
    # (A shard's log line: date, time, level, [logger], message.)
    why = json.dumps(w, indent=1) + "".join(
        f"\n--- shard {i} warnings:\n" + "\n".join(
            line for line in cluster2.log(i).splitlines()
            if line.split(" ", 3)[2:3] in (["warning"], ["error"], ["critical"]))
        for i in range(2))
    assert w[0]["samples"] + w[1]["samples"] == 2 * w[0]["train_samples"], why
    assert min(w[0]["samples"], w[1]["samples"]) > 0, why
    for s in w:
        assert s["test_auc"] > 0.75, why
        assert s["test_loss"] < 0.62, why  # a constant guess of the click rate: 0.69
        assert s["epochs"][-1]["epoch"] == 1, why
