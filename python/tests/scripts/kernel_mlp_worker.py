"""A Python worker that trains leash-worker's own MLP tables (mlp/fc1/w ... as
worker/src/mlp.cc lays them out: y = x W + b, W in_features x out_features, b one row)
beside a C++ leash-worker, for test_training.py. It opens the tables the C++ worker creates
and leases chunks of the same data plan. argv: servers train_limit chunk_size epochs
metrics_out."""
import json
import os
import sys

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "examples"))
import leash  # noqa: E402
import leash.torch  # noqa: E402
from torch_fashion_mnist import accuracy, batches, load_fashion_mnist  # noqa: E402


class KernelMlp(nn.Module):
    def __init__(self, widths=(784, 256, 128, 10)):
        super().__init__()
        for i in range(len(widths) - 1):
            setattr(self, f"fc{i + 1}_w", nn.Parameter(torch.zeros(widths[i], widths[i + 1])))
            setattr(self, f"fc{i + 1}_b", nn.Parameter(torch.zeros(widths[i + 1])))
        self.layers = len(widths) - 1

    def forward(self, x):
        for i in range(1, self.layers + 1):
            x = x @ getattr(self, f"fc{i}_w") + getattr(self, f"fc{i}_b")
            if i < self.layers:
                x = F.relu(x)
        return x


def main():
    servers, limit, chunk, epochs, out = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
    torch.set_num_threads(1)
    x, y = load_fashion_mnist("/usr/share/datasets/fashion-mnist", True, limit)
    tx, ty = load_fashion_mnist("/usr/share/datasets/fashion-mnist", False, 2000)
    model = KernelMlp()
    samples = 0
    with leash.Client(servers, name="py", staleness=1) as client:
        params = leash.torch.Parameters(client, model, create=False, open_timeout=60,
                                        names=lambda n: "mlp/" + n.replace("_", "/"))
        for c in params.chunks(dict(num_samples=limit, chunk_size=chunk, epochs=epochs, seed=1)):
            for idx in batches(c.begin, c.end, 64, c.index):
                params.pull()
                F.cross_entropy(model(x[idx]), y[idx]).backward()
                params.push()
                samples += len(idx)
        params.sync()
        acc = accuracy(model, tx, ty)
    with open(out, "w") as f:
        json.dump({"samples": samples, "test_accuracy": acc}, f)
    print(f"python worker: {samples} samples, test accuracy {acc:.4f}", flush=True)


if __name__ == "__main__":
    main()
