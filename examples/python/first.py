#!/usr/bin/python3
"""first.py: examples/first.c from Python, through GObject Introspection.

The same task (points in a disc of radius 3 labelled by their ring), the same
data (GLib's GRand from seed 7, ported in grand.py, so the points and the
shuffles are first.c's), the same model (a two-layer MLP from the builders,
seeds 1 and 2), trained the same way (mini-batch Adam under a cosine
schedule, through a compiled plan). It prints the test accuracy, saves a
checkpoint (--save PATH, else a temporary file), loads it into a fresh store
and checks the accuracy again; `qkv-first --load PATH` evaluates the same
file from C.

Run it against a build tree:

    GI_TYPELIB_PATH=build LD_LIBRARY_PATH=build /usr/bin/python3 examples/python/first.py

Tensors go in and out as bytes (GBytes): a NumPy array's tobytes() in,
numpy.frombuffer() out, one copy each way and no loop over elements.
Exits 1 when anything fails or the accuracy is below MIN_ACCURACY."""
import argparse
import math
import os
import sys
import tempfile

import gi

gi.require_version("Qkv", "0.1")
from gi.repository import GLib, Qkv  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grand import GRand  # noqa: E402

N_TRAIN, N_TEST, BATCH, HIDDEN, CLASSES, EPOCHS = 1024, 512, 32, 32, 3, 30
MIN_ACCURACY = 0.9


def make_rings(rng, n):
    """n points (x, y) and their ring labels, drawn as first.c draws them."""
    points = np.empty((n, 2), np.float32)
    labels = np.empty(n, np.int32)
    for i in range(n):
        r = 3.0 * math.sqrt(rng.double())
        a = 2 * math.pi * rng.double()
        points[i] = (r * math.cos(a), r * math.sin(a))
        labels[i] = 0 if r < 1.0 else 1 if r < 2.0 else 2
    return points, labels


def tensor(array):
    """A qkv tensor holding a copy of a NumPy array (f32 or i32)."""
    dtype = {np.dtype(np.float32): Qkv.DType.F32, np.dtype(np.int32): Qkv.DType.I32}[array.dtype]
    shape = Qkv.Shape.new(list(array.shape))
    return Qkv.Tensor.new_from_bytes(dtype, shape, GLib.Bytes.new(np.ascontiguousarray(array).tobytes()))


def mlp(b, x):
    """Logits (n, CLASSES) for x (n, 2); the builder creates the parameters
    in its store the first time and reuses them after."""
    h = Qkv.relu(Qkv.build_linear(b, "hidden", x, HIDDEN, True))
    return Qkv.build_linear(b, "out", h, CLASSES, True)


def accuracy(params, x_test, y_test):
    """The share of the test points whose argmax class is right, from an
    evaluation graph over params."""
    g = Qkv.Graph.new()
    b = Qkv.Builder.new(g, params, 2)  # the seed only initialises params the store lacks
    x = g.input("x", Qkv.DType.F32, x_test.shape())
    y = g.input("y", Qkv.DType.I32, y_test.shape())
    pred = Qkv.argmax(mlp(b, x), 1, False)
    right = Qkv.mean(Qkv.eq(pred, y), None, False)
    (result,) = g.eval_to_array(["x", "y"], [x_test, y_test], [right])
    return np.frombuffer(result.to_bytes().get_data(), np.float32)[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--save", help="where to save the checkpoint (default: a temporary file)")
    args = parser.parse_args()

    rng = GRand(7)
    x_train, y_train = make_rings(rng, N_TRAIN)
    x_test, y_test = make_rings(rng, N_TEST)
    x_test_t, y_test_t = tensor(x_test), tensor(y_test)

    # the training graph: the model, its loss, and the gradient nodes
    params = Qkv.Params.new()
    g = Qkv.Graph.new()
    b = Qkv.Builder.new(g, params, 1)
    x = g.input("x", Qkv.DType.F32, Qkv.Shape.new([BATCH, 2]))
    y = g.input("y", Qkv.DType.I32, Qkv.Shape.new([BATCH]))
    loss = Qkv.cross_entropy(mlp(b, x), y, None, Qkv.Reduction.MEAN)
    g.backward(loss)
    options = Qkv.PlanOptions.new()
    options.training = True
    plan = g.compile([loss], options)

    # bound once; each step refills them in place
    x_batch = Qkv.Tensor.new(Qkv.DType.F32, Qkv.Shape.new([BATCH, 2]))
    y_batch = Qkv.Tensor.new(Qkv.DType.I32, Qkv.Shape.new([BATCH]))
    plan.bind("x", x_batch)
    plan.bind("y", y_batch)

    steps_per_epoch = N_TRAIN // BATCH
    opt = Qkv.Optimizer.new_adam(params, Qkv.OptimConfig.new(Qkv.OptimizerKind.ADAM, 0.02))
    schedule = Qkv.Schedule.new_cosine(0.02, EPOCHS * steps_per_epoch, 0.001)

    order = list(range(N_TRAIN))
    last_loss = 0.0
    for _ in range(EPOCHS):
        for i in range(N_TRAIN - 1, 0, -1):  # the shuffle first.c makes
            j = rng.int_range(0, i + 1)
            order[i], order[j] = order[j], order[i]
        for s in range(steps_per_epoch):
            rows = order[s * BATCH:(s + 1) * BATCH]
            x_batch.set_bytes(GLib.Bytes.new(x_train[rows].tobytes()))
            y_batch.set_bytes(GLib.Bytes.new(y_train[rows].tobytes()))
            schedule.step(opt)  # sets the lr for this update
            plan.run()  # forward, and d loss / d params
            opt.step()
            last_loss = plan.output_scalar(0)

    acc = accuracy(params, x_test_t, y_test_t)
    print(f"last batch loss {last_loss:.4f}, test accuracy {acc:.3f}")

    # save, load into a fresh store, evaluate again
    with tempfile.TemporaryDirectory(prefix="qkv-first-py-") as tmp:
        path = args.save or os.path.join(tmp, "first.safetensors")
        Qkv.checkpoint_save(path, params, opt, schedule, None)
        restored = Qkv.Params.new()
        acc_untrained = accuracy(restored, x_test_t, y_test_t)
        Qkv.checkpoint_load(path, restored, None, None, Qkv.CheckpointFlags.STRICT)
        acc_restored = accuracy(restored, x_test_t, y_test_t)
    print(f"a fresh store: test accuracy {acc_untrained:.3f}; "
          f"after loading the checkpoint: {acc_restored:.3f}")
    if acc_restored != acc:
        print(f"first.py: the loaded checkpoint gives accuracy {acc_restored:.4f}, not {acc:.4f}",
              file=sys.stderr)
        return 1
    if acc < MIN_ACCURACY:
        print(f"first.py: test accuracy {acc:.3f} is below {MIN_ACCURACY}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except GLib.Error as e:
        print(f"first.py: {e.message}", file=sys.stderr)
        sys.exit(1)
