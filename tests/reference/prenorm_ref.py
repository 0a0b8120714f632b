#!/usr/bin/python3
"""Reference data for tests/test-models.c: a pre-LN Transformer made of
PyTorch's own layers, nn.TransformerEncoderLayer and nn.TransformerDecoderLayer
with norm_first=True, activation="gelu" and their default biases, each stack
closed by an nn.LayerNorm (the norm= of nn.TransformerEncoder and
nn.TransformerDecoder), on the book's embedding · √d + positional encoding
and dense output layer: qkv's Transformer builders with
QkvTransformerConfig.norm_first, ffn_activation = QKV_ACTIVATION_GELU and
attention_bias. Dropout 0.

It writes two safetensors files under tests/data/:
  prenorm_ref_params.safetensors   the parameters under qkv's names (the
                                   mapping below: in_proj_weight split into
                                   W_q, W_k, W_v, and so on)
  prenorm_ref_io.safetensors       one batch — src (B,T) i32, src_valid (B)
                                   i32, dec_in, labels (B,T) i32, mask (B,T)
                                   f32 — the logits, the book's loss (sum over
                                   the batch of the masked mean over time of
                                   the cross-entropy) and every parameter's
                                   gradient as "grad.<qkv name>".

Run: /usr/bin/python3 tests/reference/prenorm_ref.py
"""
import json
import math
import os
import struct

import torch
from torch import nn

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        if t.dtype == torch.float32:
            dtype, raw = "F32", t.numpy().astype("<f4").tobytes()
        else:
            dtype, raw = "I32", t.to(torch.int32).numpy().astype("<i4").tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def positional_table(T, d):
    """The book's PositionalEncoding."""
    P = torch.zeros((1, T, d))
    X = torch.arange(T, dtype=torch.float32).reshape(-1, 1) / torch.pow(
        10000, torch.arange(0, d, 2, dtype=torch.float32) / d)
    P[:, :, 0::2] = torch.sin(X)
    P[:, :, 1::2] = torch.cos(X)
    return P


class PreLNTransformer(nn.Module):
    def __init__(self, src_vocab, tgt_vocab, d, f, heads, layers):
        super().__init__()
        self.d = d
        self.enc_embedding = nn.Embedding(src_vocab, d)
        self.dec_embedding = nn.Embedding(tgt_vocab, d)

        def layer(kind):
            return kind(d, heads, f, dropout=0.0, activation="gelu", batch_first=True,
                        norm_first=True)
        self.enc_layers = nn.ModuleList(layer(nn.TransformerEncoderLayer) for _ in range(layers))
        self.dec_layers = nn.ModuleList(layer(nn.TransformerDecoderLayer) for _ in range(layers))
        self.enc_norm, self.dec_norm = nn.LayerNorm(d), nn.LayerNorm(d)
        self.dense = nn.Linear(d, tgt_vocab)

    def forward(self, src, src_valid, dec_in):
        T, Tt = src.shape[1], dec_in.shape[1]
        padding = torch.arange(T)[None, :] >= src_valid[:, None]
        causal = torch.triu(torch.full((Tt, Tt), float("-inf")), diagonal=1)
        x = self.enc_embedding(src) * math.sqrt(self.d) + positional_table(T, self.d)
        for lyr in self.enc_layers:
            x = lyr(x, src_key_padding_mask=padding)
        x = self.enc_norm(x)
        y = self.dec_embedding(dec_in) * math.sqrt(self.d) + positional_table(Tt, self.d)
        for lyr in self.dec_layers:
            y = lyr(y, x, tgt_mask=causal, memory_key_padding_mask=padding)
        return self.dense(self.dec_norm(y))


def attention_names(prefix, mha, d, take):
    """nn.MultiheadAttention's parameters under qkv's names."""
    out = {}
    for i, p in enumerate(("W_q", "W_k", "W_v")):
        out[f"{prefix}.{p}.weight"] = take(mha.in_proj_weight)[i * d:(i + 1) * d]
        out[f"{prefix}.{p}.bias"] = take(mha.in_proj_bias)[i * d:(i + 1) * d]
    out[f"{prefix}.W_o.weight"] = take(mha.out_proj.weight)
    out[f"{prefix}.W_o.bias"] = take(mha.out_proj.bias)
    return out


def linear_names(prefix, m, take):
    return {f"{prefix}.weight": take(m.weight), f"{prefix}.bias": take(m.bias)}


def qkv_names(net, take):
    """Every parameter (take = the value or its gradient) under qkv's name."""
    d = net.d
    out = {"encoder.embedding.weight": take(net.enc_embedding.weight),
           "decoder.embedding.weight": take(net.dec_embedding.weight)}
    for i, lyr in enumerate(net.enc_layers):
        blk = f"encoder.blks.block{i}"
        out.update(attention_names(blk + ".attention", lyr.self_attn, d, take))
        out.update(linear_names(blk + ".addnorm1.ln", lyr.norm1, take))
        out.update(linear_names(blk + ".addnorm2.ln", lyr.norm2, take))
        out.update(linear_names(blk + ".ffn.dense1", lyr.linear1, take))
        out.update(linear_names(blk + ".ffn.dense2", lyr.linear2, take))
    out.update(linear_names("encoder.norm", net.enc_norm, take))
    for i, lyr in enumerate(net.dec_layers):
        blk = f"decoder.blks.block{i}"
        out.update(attention_names(blk + ".attention1", lyr.self_attn, d, take))
        out.update(attention_names(blk + ".attention2", lyr.multihead_attn, d, take))
        for k, norm in enumerate((lyr.norm1, lyr.norm2, lyr.norm3)):
            out.update(linear_names(f"{blk}.addnorm{k + 1}.ln", norm, take))
        out.update(linear_names(blk + ".ffn.dense1", lyr.linear1, take))
        out.update(linear_names(blk + ".ffn.dense2", lyr.linear2, take))
    out.update(linear_names("decoder.norm", net.dec_norm, take))
    out.update(linear_names("decoder.dense", net.dense, take))
    return out


def book_loss(logits, labels, valid):
    weights = (torch.arange(labels.shape[1])[None, :] < valid[:, None]).float()
    ce = nn.functional.cross_entropy(logits.permute(0, 2, 1), labels, reduction="none")
    return (ce * weights).mean(dim=1).sum()


torch.manual_seed(0)
net = PreLNTransformer(src_vocab=19, tgt_vocab=23, d=16, f=24, heads=4, layers=2)
with torch.no_grad():  # biases and norms away from PyTorch's 0 and 1
    for name, p in net.named_parameters():
        if name.endswith("bias") or "norm" in name:
            p.uniform_(-0.2, 0.2)
        if "norm" in name and name.endswith("weight"):
            p.uniform_(0.5, 1.5)
# each of the 6 attentions: 4 tensors in PyTorch, 8 in qkv
assert len(qkv_names(net, lambda p: p)) == sum(1 for _ in net.parameters()) + 4 * 6

B, T = 3, 7
g = torch.Generator().manual_seed(1)
src_valid = torch.randint(2, T + 1, (B,), generator=g)
tgt_valid = torch.randint(2, T + 1, (B,), generator=g)
src = torch.randint(4, 19, (B, T), generator=g)
labels = torch.randint(4, 23, (B, T), generator=g)
for b in range(B):
    src[b, src_valid[b] - 1] = 3
    src[b, src_valid[b]:] = 1
    labels[b, tgt_valid[b] - 1] = 3
    labels[b, tgt_valid[b]:] = 1
dec_in = torch.cat([torch.full((B, 1), 2), labels[:, :-1]], 1)
mask = (torch.arange(T)[None, :] < tgt_valid[:, None]).float()
logits = net(src, src_valid, dec_in)
loss = book_loss(logits, labels, tgt_valid)
loss.backward()

write_safetensors(os.path.join(OUT, "prenorm_ref_params.safetensors"),
                  qkv_names(net, lambda p: p))
io = {"src": src, "src_valid": src_valid, "dec_in": dec_in, "labels": labels, "mask": mask,
      "logits": logits, "loss": loss.reshape(())}
for name, grad in qkv_names(net, lambda p: p.grad).items():
    io["grad." + name] = grad
write_safetensors(os.path.join(OUT, "prenorm_ref_io.safetensors"), io)
print("prenorm loss", float(loss), "params", sum(p.numel() for p in net.parameters()))
