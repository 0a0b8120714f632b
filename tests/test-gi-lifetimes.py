#!/usr/bin/python3
"""test-gi-lifetimes.py: qkv from Python (Qkv-0.1.typelib) with objects freed
in whatever order the garbage collector picks. Each case drops Python's
handles in an order that a plain C free would not survive (the graph before
its values, the store before the graph, the graph before its plan), then
uses what is left; a rolled-back value stays readable and is refused in new
nodes with a GLib.Error; NumPy arrays round-trip through bytes exactly.
Exits 77 (skipped) without PyGObject, NumPy or the typelib."""
import gc
import sys

try:
    import gi

    gi.require_version("Qkv", "0.1")
    from gi.repository import GLib, Qkv
    import numpy as np
except (ImportError, ValueError) as e:
    print(f"skipped: {e}")
    sys.exit(77)


def shape(*dims):
    return Qkv.Shape.new(list(dims))


def tensor(a):
    dtype = Qkv.DType.F32 if a.dtype == np.float32 else Qkv.DType.I32
    return Qkv.Tensor.new_from_bytes(dtype, shape(*a.shape), GLib.Bytes.new(a.tobytes()))


def array(t, dtype=np.float32):
    return np.frombuffer(t.to_bytes().get_data(), dtype).reshape(t.shape().get_dims())


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")
    print(f"ok: {what}")


# values outlive the graph's own handle
g = Qkv.Graph.new()
x = g.input("x", Qkv.DType.F32, shape(2, 3))
y = Qkv.relu(Qkv.neg(x))
del g
gc.collect()
a = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
(out,) = x.graph().eval_to_array(["x"], [tensor(a)], [y])
check(np.array_equal(array(out), np.maximum(-a, 0)), "a value keeps its graph alive")

# the store and the graph go before the plan and the optimizer
params = Qkv.Params.new()
g = Qkv.Graph.new()
b = Qkv.Builder.new(g, params, 3)
x = g.input("x", Qkv.DType.F32, shape(4, 2))
loss = Qkv.mean(Qkv.build_linear(b, "lin", x, 3, True), None, False)
g.backward(loss)
options = Qkv.PlanOptions.new()
options.training = True
plan = g.compile([loss], options)
opt = Qkv.Optimizer.new_sgd(params, Qkv.OptimConfig.new(Qkv.OptimizerKind.SGD, 0.5))
weight = params.lookup("lin.weight").value()  # owns its data: a live view
xt = tensor(np.ones((4, 2), np.float32))
plan.bind("x", xt)
del params, g, b, x, loss
gc.collect()
w0 = array(weight).copy()
plan.run()
before = plan.output_scalar(0)
opt.step()
plan.run()
after = plan.output_scalar(0)
# every weight's gradient is the mean input, 1/3 of the 3 outputs' mean: 1/3
check(np.allclose(array(weight), w0 - 0.5 / 3, atol=1e-6), "the optimizer updates a store Python let go")
# each output falls by lr · (1/3 · 2 inputs + 1/3 bias) = 0.5; float32 rounding stays below 1e-5
check(abs(before - after - 0.5) < 1e-5, "a plan runs after its graph's handle is gone")
del plan, opt
gc.collect()

# a rollback keeps a held value readable and refuses it in new nodes
g = Qkv.Graph.new()
mark = Qkv.GraphMark()
g.mark(mark)
x = g.input("x", Qkv.DType.F32, shape(5))
r = Qkv.relu(x)
g.rollback(mark)
check(g.n_values() == 0 and r.shape().get_dims() == [5], "a rolled-back value stays readable")
try:
    Qkv.relu(r)
    check(False, "a rolled-back value is refused")
except GLib.Error as e:
    check(e.matches(Qkv.error_quark(), Qkv.Error.INVALID_ARGUMENT) and "rollback" in e.message,
          "a rolled-back value is refused with QKV_ERROR_INVALID_ARGUMENT")

# i32 bytes both ways, and a size mismatch is an error, not a crash
ids = np.array([[1, -2], [3, 2**31 - 1]], np.int32)
check(np.array_equal(array(tensor(ids), np.int32), ids), "i32 tensors round-trip through bytes")
try:
    Qkv.Tensor.new_from_bytes(Qkv.DType.F32, shape(3), GLib.Bytes.new(b"12345678"))
    check(False, "a wrong byte count is refused")
except GLib.Error as e:
    check("8 bytes" in e.message, "a wrong byte count is refused: " + e.message)
