#!/usr/bin/python3
"""Copies the PyTorch peer's reference run of config S into tests/data/, for
tests/test-peer.c.

Source: /work/shared/bench/peers/ (the PyTorch peer benchmark,
torch_transformer.py: a line-by-line port of the d2l 0.17 Transformer,
Debian python3-torch 1.13.1), written by

    /usr/bin/python3 torch_transformer.py --config S --threads 1 --steps 200 \
        --warmup 0 --dropout 0 --losses --dump-init ref_S_seed0/init \
        > ref_S_seed0/run_dropout0_200steps.json

that is: config S (d_model 32, FFN 64, 4 heads, 2 + 2 blocks, batch 64,
10 steps, vocabulary 200, Adam lr 0.005, dropout 0), torch.manual_seed(0)
initial weights (xavier_uniform_ on every Linear weight, PyTorch defaults
elsewhere), 200 training steps on the splitmix64(0) reverse-task stream,
each step backward on the book's l.sum(), grad_clipping(net, 1), Adam.

Writes
  tests/data/peer_S_seed0_init.safetensors
      the initial state_dict (ref_S_seed0/init/*.f32 + manifest.json: raw
      little-endian float32, keyed by the d2l state_dict names, Linear
      weights [out, in]) as one safetensors file, F32, in manifest order;
      qkv_checkpoint_load() reads it into the builders' store as is.
  tests/data/peer_S_seed0_losses.txt
      in the text format of qkv_test_load_reference() (tests/test-util.h):
        losses       f32 (200)    the d2l loss metric l.sum()/num_tokens
                                  of every step (run_dropout0_200steps.json)
        first_src    i32 (64, 10) the first training batch of the stream
        first_valid  i32 (64)     (ref_S_seed0/first_batch.json: X, X_valid_len,
        first_tgt    i32 (64, 10)  Y), to check the test's data generator

Needs no torch: only the files above. Run from the repository root:
    /usr/bin/python3 tests/reference/peer_init_to_safetensors.py [PEER_DIR]
(PEER_DIR defaults to /work/shared/bench/peers/ref_S_seed0).
"""
import json
import os
import struct
import sys

PEER = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/bench/peers/ref_S_seed0"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "tests", "data")


def write_safetensors(init_dir, out_path):
    with open(os.path.join(init_dir, "manifest.json")) as fh:
        manifest = json.load(fh)
    header = {"__metadata__": {
        "format": "pt",
        "source": "bench/peers/torch_transformer.py --config S --seed 0 --dump-init",
    }}
    blobs = []
    offset = 0
    for item in manifest:
        with open(os.path.join(init_dir, item["file"]), "rb") as fh:
            raw = fh.read()
        numel = 1
        for d in item["shape"]:
            numel *= d
        if len(raw) != 4 * numel:
            sys.exit("%s: %d bytes, expected %d" % (item["file"], len(raw), 4 * numel))
        header[item["key"]] = {"dtype": "F32", "shape": item["shape"],
                               "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)  # data starts at a multiple of 8
    with open(out_path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)))
        fh.write(text)
        for raw in blobs:
            fh.write(raw)
    return len(manifest), offset


def tensor_lines(name, dtype, shape, values):
    return ["tensor %s %s %d %s" % (name, dtype, len(shape), " ".join(map(str, shape))),
            " ".join(repr(v) for v in values)]


def write_losses(out_path):
    with open(os.path.join(PEER, "run_dropout0_200steps.json")) as fh:
        run = json.load(fh)
    with open(os.path.join(PEER, "first_batch.json")) as fh:
        batch = json.load(fh)
    losses = run["losses"]
    X, Y = batch["X"], batch["Y"]
    valid = batch["X_valid_len"]
    if batch["Y_valid_len"] != valid:
        sys.exit("first_batch.json: X_valid_len and Y_valid_len differ")
    lines = [
        "# PyTorch peer, config S, seed 0, dropout 0: per-step d2l loss of 200 steps",
        "# (bench/peers/ref_S_seed0/run_dropout0_200steps.json) and the first batch of",
        "# the splitmix64(0) stream (first_batch.json). Written by",
        "# tests/reference/peer_init_to_safetensors.py.",
    ]
    lines += tensor_lines("losses", "f32", [len(losses)], losses)
    lines += tensor_lines("first_src", "i32", [len(X), len(X[0])], [v for r in X for v in r])
    lines += tensor_lines("first_valid", "i32", [len(valid)], valid)
    lines += tensor_lines("first_tgt", "i32", [len(Y), len(Y[0])], [v for r in Y for v in r])
    with open(out_path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return len(losses)


if __name__ == "__main__":
    n, size = write_safetensors(os.path.join(PEER, "init"),
                                os.path.join(DATA, "peer_S_seed0_init.safetensors"))
    print("peer_S_seed0_init.safetensors: %d tensors, %d bytes of data" % (n, size))
    k = write_losses(os.path.join(DATA, "peer_S_seed0_losses.txt"))
    print("peer_S_seed0_losses.txt: %d losses and the first batch" % k)
