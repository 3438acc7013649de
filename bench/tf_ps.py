#!/usr/bin/env python3
"""TensorFlow peer of the Leash training benchmark: ParameterServerStrategy with 1
parameter server and N workers (default 2), separate processes on loopback described by
TF_CONFIG, and this process as the coordinator (chief) running a custom training loop.
The same MLP or CNN, optimizer (SGD momentum 0.9 lr 0.01 / Adam 1e-3), batch 64 per step
and normalization as leash-worker; 1 intra-op (math) thread in every process.
Variables and optimizer slots live on the parameter server: each step reads the
variables from it and applies the update there, as Leash's shard does.

Each worker reads the IDX gz files itself (tf.data), caches the raw bytes, shuffles and
batches. An epoch is n/64 steps scheduled on whichever worker is free; after it, the
coordinator copies the variables from the PS into a local model and measures the test
accuracy. Writes the same JSON as bench/torch_train.py to --out.

Needs tensorflow-cpu (bench/setup-tf.sh installs it into /opt/leash-bench-venv):
  $(bash bench/setup-tf.sh) bench/tf_ps.py --model mlp --epochs 2 --out /tmp/tf.json
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def configure_threads(tf):
    # 1 intra-op (math) thread; inter-op threads are left to TF: with 1 of them the
    # coordinator and the PS deadlock (a blocked remote op holds the only thread).
    tf.config.threading.set_intra_op_parallelism_threads(1)


def serve(tf):
    """A PS or worker task: serves its part of the cluster until killed."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1)
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
                                  protocol="grpc", config=config, start=True)
    print(f"[tf {resolver.task_type} {resolver.task_id}] serving", flush=True)
    server.join()


def build_model(tf, name):
    L = tf.keras.layers
    if name == "mlp":
        layers = [L.Dense(256, activation="relu", kernel_initializer="he_normal"),
                  L.Dense(128, activation="relu", kernel_initializer="he_normal"),
                  L.Dense(10, kernel_initializer="he_normal")]
    else:
        layers = [L.Reshape((28, 28, 1)),
                  L.Conv2D(32, 3, padding="same", activation="relu", kernel_initializer="he_normal"), L.MaxPool2D(2),
                  L.Conv2D(64, 3, padding="same", activation="relu", kernel_initializer="he_normal"), L.MaxPool2D(2),
                  L.Flatten(), L.Dense(128, activation="relu", kernel_initializer="he_normal"),
                  L.Dense(10, kernel_initializer="he_normal")]
    model = tf.keras.Sequential([tf.keras.Input(shape=(784,))] + layers)
    return model


def coordinate(tf, a):
    from common import fmnist

    configure_threads(tf)
    tf.random.set_seed(a.seed)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = build_model(tf, a.model)
        if a.model == "mlp":
            opt = tf.keras.optimizers.legacy.SGD(learning_rate=0.01, momentum=0.9)
        else:
            opt = tf.keras.optimizers.legacy.Adam(learning_rate=1e-3)

    images_path = os.path.join(a.data, "train-images-idx3-ubyte.gz")
    labels_path = os.path.join(a.data, "train-labels-idx1-ubyte.gz")
    n = 60000 if not a.train_limit else min(60000, a.train_limit)
    mean, std = fmnist.MEAN, fmnist.STDDEV

    def dataset_fn(_):
        images = tf.data.FixedLengthRecordDataset(images_path, 784, header_bytes=16, compression_type="GZIP")
        labels = tf.data.FixedLengthRecordDataset(labels_path, 1, header_bytes=8, compression_type="GZIP")
        ds = tf.data.Dataset.zip((images, labels)).take(n).cache().shuffle(n).repeat()

        def decode(img, lbl):
            x = (tf.cast(tf.io.decode_raw(img, tf.uint8), tf.float32) / 255.0 - mean) / std
            return x, tf.cast(tf.io.decode_raw(lbl, tf.uint8)[0], tf.int32)

        return ds.map(decode).batch(a.batch, drop_remainder=True).prefetch(2)

    @tf.function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    per_worker_iter = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

    @tf.function
    def train_fn(iterator):
        def replica_fn(batch):
            x, y = batch
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.run(replica_fn, args=(next(iterator),))

    local = build_model(tf, a.model)
    tx, ty = fmnist.load(False, a.data, a.test_limit)

    def test_accuracy():
        local.set_weights([v.numpy() for v in model.weights])
        correct = 0
        for i in range(0, tx.shape[0], 1000):
            correct += int((local(tx[i:i + 1000], training=False).numpy().argmax(1) == ty[i:i + 1000]).sum())
        return correct / tx.shape[0]

    steps = n // a.batch
    # One step first (builds the functions on the workers, the variables on the PS),
    # outside the timed epochs, as the other systems' setup is.
    coordinator.schedule(train_fn, args=(per_worker_iter,))
    coordinator.join()
    epochs = []
    start = time.perf_counter()
    for e in range(a.epochs):
        t0 = time.perf_counter()
        for _ in range(steps):
            coordinator.schedule(train_fn, args=(per_worker_iter,))
        coordinator.join()
        secs = time.perf_counter() - t0
        acc = test_accuracy()
        epochs.append({"epoch": e + 1, "samples": steps * a.batch, "train_seconds": secs,
                       "samples_per_second": steps * a.batch / secs, "test_accuracy": acc,
                       "elapsed_seconds": time.perf_counter() - start})
        print(f"[tf ps 1+{a.workers}] epoch {e + 1}: {steps * a.batch / secs:.0f} samples/s, test accuracy {acc:.4f}",
              flush=True)
    return epochs


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--serve", action="store_true", help="(internal) run the PS/worker task TF_CONFIG names")
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--train-limit", type=int, default=0)
    p.add_argument("--test-limit", type=int, default=0)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--out")
    a = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if a.serve:
        import tensorflow as tf
        serve(tf)
        return 0
    if not a.out:
        p.error("--out is required")
    from common.util import free_port, stop

    cluster = {"chief": [f"127.0.0.1:{free_port()}"],
               "worker": [f"127.0.0.1:{free_port()}" for _ in range(a.workers)],
               "ps": [f"127.0.0.1:{free_port()}"]}
    procs = []
    try:
        for job in ("ps", "worker"):
            for i in range(len(cluster[job])):
                env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": job, "index": i}}))
                procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"], env=env))
        os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}})
        import tensorflow as tf
        epochs = coordinate(tf, a)
        samples = sum(e["samples"] for e in epochs)
        seconds = sum(e["train_seconds"] for e in epochs)
        result = {"system": "tf-ps", "model": a.model, "batch": a.batch, "threads_per_process": 1,
                  "processes": 2 + a.workers, "tensorflow": tf.__version__, "parameter_servers": 1,
                  "workers": a.workers, "epochs": epochs, "samples_per_second": samples / seconds}
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
    finally:
        for proc in procs:
            stop(proc, timeout=10)
    # The coordinator's gRPC threads may keep the interpreter alive after the servers
    # are gone; the result is written, so leave at once.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
