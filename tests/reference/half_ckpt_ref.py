#!/usr/bin/python3
"""Writes the half-precision safetensors fixtures of tests/test-checkpoint.c.

PyTorch is not installed where these were made, so the script uses only the
standard library. Its F16 values come from Python's own IEEE half packing
(struct format 'e', round to nearest even), an implementation independent of
qkv's; the expected f32 of each is Python's exact unpacking of those bits.

  tests/data/half_ref.safetensors
      "f16", "bf16", "f64" and, for each, "<name>.expected": the F32 bit
      patterns qkv must load it into (F16, BF16: exactly; F64: rounded to
      nearest even, out of range to infinity).
  tests/data/half_adam.safetensors
      a checkpoint for the store of tests/fuzz/fuzz-checkpoint.c
      ("layer.weight" (3, 4), "layer.bias" (4), "scale" (), "emb" (5, 2))
      with Adam state and a step schedule's position, its tensors in BF16,
      F16, F64, F32, I32 and I64 (values each dtype holds exactly): a test
      fixture and a fuzz seed.

Run from the repository root: /usr/bin/python3 tests/reference/half_ckpt_ref.py
"""
import json
import math
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")

# 2^128 - 2^103: halfway between FLT_MAX and 2^128, where f32 rounding overflows
EDGE = 2.0**128 - 2.0**103

SIZES = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2}


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def bf16_from_f32_bits(u):
    """Round f32 bits to bfloat16, to nearest, ties to even."""
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return (u >> 16) | 0x0040
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def f64_to_f32_bits(x):
    if math.isnan(x) or math.isinf(x):
        return f32_bits(x)
    try:
        return f32_bits(x)
    except OverflowError:  # struct refuses what a cast rounds to infinity
        return 0xFF800000 if x < 0 else 0x7F800000


def pack_u16(values):
    return b"".join(struct.pack("<H", v) for v in values)


def pack_u32(values):
    return b"".join(struct.pack("<I", v) for v in values)


def write(path, tensors, metadata):
    """tensors: (name, dtype, shape, bytes) in header order. The data goes
    8-byte dtypes first, then 4, then 2, so each tensor is aligned to its
    element size, as safetensors' own writer lays them out."""
    header = {"__metadata__": metadata}
    data = b""
    for size in (8, 4, 2):
        for name, dtype, shape, raw in tensors:
            if SIZES[dtype] != size:
                continue
            assert len(raw) == size * math.prod(shape)
            header[name] = {"dtype": dtype, "shape": shape,
                            "data_offsets": [len(data), len(data) + len(raw)]}
            data += raw
    ordered = {"__metadata__": metadata}
    for name, *_ in tensors:
        ordered[name] = header[name]
    text = json.dumps(ordered, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def half_ref():
    f16_values = [0.0, -0.0, 1.0, -2.5, 1 / 3, 0.1, 3.14159, -1000.3,
                  65504.0, 65519.99,            # the largest, and what rounds to it
                  2.0**-14,                     # smallest normal
                  2.0**-14 - 2.0**-24,          # largest subnormal
                  2.0**-24, -(2.0**-24),        # smallest subnormal
                  1.5 * 2.0**-25,               # rounds up to 2^-24
                  1e-8,                         # rounds to 0
                  1 + 2.0**-11, 1 + 3 * 2.0**-11]  # ties, to even
    f16 = [struct.unpack("<H", struct.pack("<e", v))[0] for v in f16_values]
    f16 += [0x7C00, 0xFC00, 0x7E00, 0x3555, 0x0200]  # +-inf, NaN, 1/3, 2^-15
    f16_expected = [f32_bits(struct.unpack("<e", struct.pack("<H", h))[0]) for h in f16]

    bf16_values = [0.0, -0.0, 1.0, -1.0, 0.1, 1 / 3, -3.0e38, 1.0e-39, 2.0**-133,
                   float("inf"), float("-inf"), float("nan")]
    bf16 = [bf16_from_f32_bits(f32_bits(v)) for v in bf16_values]
    bf16 += [0x7F7F, 0x0080, 0x007F, 0x8001]  # max, min normal, max and min subnormal
    bf16_expected = [b << 16 for b in bf16]

    f64 = [0.1, 1 / 3, -2.5, 1e300, -1e300, 1e-50, -1e-50, 2.0**-149,
           2.0**-150,                 # tie between 0 and 2^-149: to 0
           3 * 2.0**-150,             # tie: to 2^-148
           1 + 2.0**-24, 1 + 3 * 2.0**-24, 16777217.0,
           math.nextafter(EDGE, 0.0),  # just below the overflow edge: FLT_MAX
           EDGE,                       # FLT_MAX + half an ulp, a tie: to infinity
           float("inf"), float("-inf"), float("nan"), -0.0]
    f64_expected = [f64_to_f32_bits(v) for v in f64]

    write(os.path.join(OUT, "half_ref.safetensors"), [
        ("f16", "F16", [len(f16)], pack_u16(f16)),
        ("f16.expected", "F32", [len(f16)], pack_u32(f16_expected)),
        ("bf16", "BF16", [len(bf16)], pack_u16(bf16)),
        ("bf16.expected", "F32", [len(bf16)], pack_u32(bf16_expected)),
        ("f64", "F64", [len(f64)], b"".join(struct.pack("<d", v) for v in f64)),
        ("f64.expected", "F32", [len(f64)], pack_u32(f64_expected)),
    ], {"source": "half_ckpt_ref.py"})


def encode(dtype, values):
    if dtype == "F16":
        return b"".join(struct.pack("<e", v) for v in values)
    if dtype == "BF16":
        return pack_u16(bf16_from_f32_bits(f32_bits(v)) for v in values)
    if dtype == "F64":
        return b"".join(struct.pack("<d", v) for v in values)
    if dtype == "F32":
        return b"".join(struct.pack("<f", v) for v in values)
    if dtype == "I64":
        return b"".join(struct.pack("<q", v) for v in values)
    return b"".join(struct.pack("<i", v) for v in values)


def half_adam():
    params = [("layer.weight", [3, 4], "BF16", "F16", "BF16", "I64"),
              ("layer.bias", [4], "F16", "BF16", "F64", "I32"),
              ("scale", [], "F64", "F32", "F16", "I64"),
              ("emb", [5, 2], "F32", "F64", "BF16", "I32")]
    tensors = []
    for i, (name, shape, value_dt, avg_dt, sq_dt, step_dt) in enumerate(params):
        n = math.prod(shape)
        value = [(k * 37 + i) % 11 / 8 - 0.5 for k in range(n)]
        # values every dtype holds exactly, so the test knows what loads
        avg = [((k + i) % 5 - 2) / 64 for k in range(n)]
        sq = [(k % 3 + 1) / 1024 for k in range(n)]
        tensors.append((name, value_dt, shape, encode(value_dt, value)))
        tensors.append((f"__optim__.{name}.exp_avg", avg_dt, shape, encode(avg_dt, avg)))
        tensors.append((f"__optim__.{name}.exp_avg_sq", sq_dt, shape, encode(sq_dt, sq)))
        tensors.append((f"__optim__.{name}.step", step_dt, [], encode(step_dt, [2])))
    metadata = {"format": "pt", "qkv.version": "half_ckpt_ref.py",
                "qkv.optimizer.kind": "adam", "qkv.optimizer.step": "2",
                "qkv.optimizer.lr": "0.01", "qkv.optimizer.weight_decay": "0",
                "qkv.optimizer.momentum": "0", "qkv.optimizer.dampening": "0",
                "qkv.optimizer.nesterov": "false", "qkv.optimizer.beta1": "0.9",
                "qkv.optimizer.beta2": "0.999", "qkv.optimizer.eps": "1e-08",
                "qkv.schedule.kind": "step", "qkv.schedule.position": "2"}
    write(os.path.join(OUT, "half_adam.safetensors"), tensors, metadata)


if __name__ == "__main__":
    half_ref()
    half_adam()
