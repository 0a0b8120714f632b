#!/usr/bin/python3
"""safetensors interoperability for tests/test-checkpoint.c.

Debian has no python3-safetensors package, so this script writes and reads the
format by hand with struct + json, following the reference implementation
(https://github.com/huggingface/safetensors): an 8-byte little-endian header
length N, N bytes of JSON ({name: {dtype, shape, data_offsets}} plus an
optional "__metadata__" string->string map) padded with spaces to a multiple
of 8, then the raw little-endian data, tensors back to back.

Modes:

  safetensors_ref.py
      Write tests/data/torch_ref.safetensors (tensors made with torch, laid
      out as safetensors.torch.save_file does: sorted by dtype size then
      name) and tests/data/torch_ref.txt, the same values in the text format
      of qkv_test_load_reference(). test-checkpoint.c loads both and compares.

  safetensors_ref.py --check FILE
      A manual check that a file qkv wrote is valid safetensors: read it with
      the reference implementation's rules (header length within the file,
      JSON object, string metadata, known dtypes, shapes, offsets sorted,
      contiguous, covering the whole data section, sizes equal to
      dtype x shape), build torch tensors from it and print a summary. Exits
      non-zero on the first violation. To get a file from qkv:

        QKV_TEST_KEEP_CHECKPOINT=/tmp/qkv.safetensors \\
          meson test -C build checkpoint
        /usr/bin/python3 tests/reference/safetensors_ref.py --check /tmp/qkv.safetensors
"""
import json
import os
import struct
import sys

import torch

DTYPES = {
    "F64": (torch.float64, 8), "F32": (torch.float32, 4), "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2), "I64": (torch.int64, 8), "I32": (torch.int32, 4),
    "I16": (torch.int16, 2), "I8": (torch.int8, 1), "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
}
NAMES = {v[0]: k for k, v in DTYPES.items()}
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")


def save(tensors, metadata, path):
    """Like safetensors.torch.save_file."""
    order = sorted(tensors, key=lambda k: (-DTYPES[NAMES[tensors[k].dtype]][1], k))
    header = {"__metadata__": metadata} if metadata else {}
    offset = 0
    blobs = []
    for name in order:
        t = tensors[name].contiguous()
        raw = t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for raw in blobs:
            f.write(raw)


def fail(msg):
    print("INVALID: " + msg)
    sys.exit(1)


def check(path):
    data = open(path, "rb").read()
    if len(data) < 8:
        fail("shorter than 8 bytes")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        fail("header length %d past the end of the file (%d bytes)" % (n, len(data)))
    if n > 100_000_000:
        fail("header too large")
    raw = data[8:8 + n]
    if not raw.startswith(b"{"):
        fail("header does not start with '{'")
    header = json.loads(raw.decode("utf-8"))
    if not isinstance(header, dict):
        fail("header is not an object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        fail("__metadata__ is not a string->string map")
    body = data[8 + n:]
    if (8 + n) % 8 != 0:
        print("note: data section not 8-byte aligned (allowed, but the reference pads)")
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"])
    expected = 0
    tensors = {}
    for name, info in entries:
        if set(info) != {"dtype", "shape", "data_offsets"}:
            fail("%s: keys %s" % (name, sorted(info)))
        if info["dtype"] not in DTYPES:
            fail("%s: unknown dtype %s" % (name, info["dtype"]))
        dtype, size = DTYPES[info["dtype"]]
        shape = info["shape"]
        begin, end = info["data_offsets"]
        if begin != expected:
            fail("%s: offsets not contiguous (begins at %d, expected %d)" % (name, begin, expected))
        numel = 1
        for d in shape:
            if not isinstance(d, int) or d < 0:
                fail("%s: bad shape %s" % (name, shape))
            numel *= d
        if end - begin != numel * size:
            fail("%s: %d bytes for %s %s" % (name, end - begin, info["dtype"], shape))
        expected = end
        buf = bytearray(body[begin:end])
        t = torch.frombuffer(buf, dtype=dtype) if numel else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(shape)
    if expected != len(body):
        fail("data section has %d bytes, tensors cover %d" % (len(body), expected))
    print("OK: %s: %d tensors, %d data bytes, header %d bytes" % (path, len(tensors), len(body), n))
    for k in sorted(metadata):
        print("  metadata %s = %s" % (k, metadata[k]))
    for name in (k for k, _ in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"])):
        t = tensors[name]
        head = ", ".join("%.6g" % v for v in t.reshape(-1)[:4].tolist())
        print("  %-40s %-8s %-14s sum %.9g  [%s%s]" % (
            name, str(t.dtype).replace("torch.", ""), tuple(t.shape),
            float(t.double().sum()) if t.numel() else 0.0, head, ", ..." if t.numel() > 4 else ""))
    return tensors, metadata


def dump_text(tensors, path):
    with open(path, "w") as out:
        out.write("# values of torch_ref.safetensors, written by tests/reference/safetensors_ref.py\n")
        for name in sorted(tensors):
            t = tensors[name]
            kind = "f32" if t.dtype == torch.float32 else "i32"
            out.write("tensor %s %s %d %s\n" % (name, kind, t.dim(), " ".join(map(str, t.shape))))
            fmt = "%.9g" if kind == "f32" else "%d"
            out.write(" ".join(fmt % v for v in t.reshape(-1).tolist()) + "\n")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        check(sys.argv[2])
        return
    torch.manual_seed(0)
    tensors = {
        "encoder.layers.0.linear.weight": torch.randn(3, 5),
        "encoder.layers.0.linear.bias": torch.randn(3),
        "embedding.weight": torch.randn(4, 2),
        "temperature": torch.tensor(0.75),
        "empty": torch.zeros(0, 3),
        "position_ids": torch.arange(6, dtype=torch.int64).reshape(1, 6),
        "counts": torch.tensor([[1, -2], [3, 2147483647]], dtype=torch.int32),
    }
    path = os.path.join(DATA, "torch_ref.safetensors")
    save(tensors, {"format": "pt", "source": "safetensors_ref.py"}, path)
    check(path)
    dump_text(tensors, os.path.join(DATA, "torch_ref.txt"))


if __name__ == "__main__":
    main()
