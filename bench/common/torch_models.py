"""The Leash worker's two models in PyTorch, with the same shapes and initialization
scheme (He-normal weights, zero biases): the MLP 784-256-128-10 (worker/src/mlp.cc) and
the CNN conv32-pool-conv64-pool-dense128-dense10, 3x3 'same' convolutions
(worker/src/cnn.cc). Modules are used by one process (or shared read/write by Hogwild)."""
import torch
from torch import nn


def _he_init(module):
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            nn.init.zeros_(m.bias)
    return module


def make_model(name):
    if name == "mlp":
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    elif name == "cnn":
        model = nn.Sequential(nn.Unflatten(1, (1, 28, 28)),
                              nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    else:
        raise ValueError(f"unknown model {name!r} (mlp or cnn)")
    return _he_init(model)


def make_optimizer(name, params):
    """The optimizer the Leash docs use for each model: SGD momentum 0.9 lr 0.01 for
    the MLP, Adam lr 1e-3 for the CNN."""
    if name == "mlp":
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)
    return torch.optim.Adam(params, lr=1e-3)


@torch.no_grad()
def accuracy(model, x, y, chunk=1000):
    model.eval()
    correct = 0
    for i in range(0, x.shape[0], chunk):
        correct += (model(x[i:i + chunk]).argmax(1) == y[i:i + chunk]).sum().item()
    model.train()
    return correct / x.shape[0]
