"""Fashion-MNIST for the Python peers, read from the same IDX gz files as the Leash worker
(Debian package dataset-fashion-mnist) and normalized exactly as worker/src/dataset.cc
does: pixel / 255, then (x - 0.2860) / 0.3530. numpy only; thread-safe (no state)."""
import gzip
import os
import struct
import tempfile

import numpy as np

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
MEAN = 0.2860  # worker/include/leash/worker/dataset.h LoadIdx defaults
STDDEV = 0.3530
IMAGE_MAGIC = 0x00000803
LABEL_MAGIC = 0x00000801


def _open(path):
    if os.path.exists(path + ".gz"):
        return gzip.open(path + ".gz", "rb")
    if os.path.exists(path):
        return open(path, "rb")
    raise FileNotFoundError(f"neither {path}.gz nor {path} exists (apt-get install dataset-fashion-mnist)")


def read_idx(path, magic, ndims):
    with _open(path) as f:
        data = f.read()
    if len(data) < 4 + 4 * ndims:
        raise ValueError(f"{path}: truncated IDX header")
    got = struct.unpack(">I", data[:4])[0]
    if got != magic:
        raise ValueError(f"{path}: bad magic 0x{got:08x}, expected 0x{magic:08x}")
    dims = struct.unpack(">" + "I" * ndims, data[4:4 + 4 * ndims])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndims)
    if body.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {body.size} bytes of data, header says {int(np.prod(dims))}")
    return body.reshape(dims)


def _cache_path(images_file):
    """Normalized arrays are cached as .npy (decompressing is slow on a loaded machine),
    keyed by the source file's path, size and mtime."""
    try:
        st = os.stat(images_file + ".gz") if os.path.exists(images_file + ".gz") else os.stat(images_file)
    except OSError:
        return None
    key = f"{os.path.abspath(images_file).replace('/', '_')}-{st.st_size}-{int(st.st_mtime)}"
    d = os.path.join(tempfile.gettempdir(), "leash-bench-fmnist-cache")
    return os.path.join(d, key + ".npz")


def load(train, data_dir=DEFAULT_DIR, limit=0):
    """(images float32 [n, 784] normalized, labels int64 [n]) of the train or test set."""
    prefix = "train" if train else "t10k"
    cache = _cache_path(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte"))
    if cache and os.path.exists(cache):
        with np.load(cache) as z:
            x, y = z["x"], z["y"]
    else:
        x, y = _load_idx(prefix, data_dir)
        if cache:
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            tmp = cache + f".{os.getpid()}.npz"
            np.savez(tmp, x=x, y=y)
            os.replace(tmp, cache)
    if limit and limit < x.shape[0]:
        x, y = x[:limit], y[:limit]
    return x, y


def _load_idx(prefix, data_dir):
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte"), IMAGE_MAGIC, 3)
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte"), LABEL_MAGIC, 1)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {labels.shape[0]} labels")
    table = ((np.arange(256, dtype=np.float32) / np.float32(255.0) - np.float32(MEAN)) / np.float32(STDDEV)).astype(np.float32)
    x = table[images.reshape(images.shape[0], -1)]
    return x, labels.astype(np.int64)
