#!/usr/bin/python3
"""Reference data for tests/test-models.c: the book's Transformer and its
GRU + Bahdanau-attention seq2seq model (d2l 0.17, chapter 10), defined here
in PyTorch the way the book defines them, with random weights and dropout 0.

For each model it writes two safetensors files under tests/data/:
  <model>_ref_params.safetensors   the state_dict (the book's names)
  <model>_ref_io.safetensors       one batch — src (B,T) i32, src_valid (B)
                                   i32, dec_in, labels (B,T) i32, mask (B,T)
                                   f32 — the logits, the loss the book
                                   backpropagates (l.sum() of
                                   MaskedSoftmaxCELoss) and every parameter's
                                   gradient as "grad.<name>".

Run: /usr/bin/python3 tests/reference/seq2seq_ref.py
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


# ---- the book's modules, restated ----

def sequence_mask(x, valid_len, value=0.0):
    maxlen = x.size(1)
    mask = torch.arange(maxlen, dtype=torch.float32)[None, :] < valid_len[:, None]
    x[~mask] = value
    return x


def masked_softmax(x, valid_lens):
    if valid_lens is None:
        return nn.functional.softmax(x, dim=-1)
    shape = x.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    x = sequence_mask(x.reshape(-1, shape[-1]), valid_lens, value=-1e6)
    return nn.functional.softmax(x.reshape(shape), dim=-1)


class DotProductAttention(nn.Module):
    def forward(self, q, k, v, valid_lens):
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(q.shape[-1])
        return torch.bmm(masked_softmax(scores, valid_lens), v)


class MultiHeadAttention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.attention = DotProductAttention()
        self.W_q = nn.Linear(d, d, bias=False)
        self.W_k = nn.Linear(d, d, bias=False)
        self.W_v = nn.Linear(d, d, bias=False)
        self.W_o = nn.Linear(d, d, bias=False)

    def split(self, x):
        x = x.reshape(x.shape[0], x.shape[1], self.heads, -1).permute(0, 2, 1, 3)
        return x.reshape(-1, x.shape[2], x.shape[3])

    def forward(self, q, k, v, valid_lens):
        q, k, v = self.split(self.W_q(q)), self.split(self.W_k(k)), self.split(self.W_v(v))
        if valid_lens is not None:
            valid_lens = torch.repeat_interleave(valid_lens, repeats=self.heads, dim=0)
        out = self.attention(q, k, v, valid_lens)
        out = out.reshape(-1, self.heads, out.shape[1], out.shape[2]).permute(0, 2, 1, 3)
        return self.W_o(out.reshape(out.shape[0], out.shape[1], -1))


def positional_table(T, d):
    P = torch.zeros((1, T, d))
    X = torch.arange(T, dtype=torch.float32).reshape(-1, 1) / torch.pow(
        10000, torch.arange(0, d, 2, dtype=torch.float32) / d)
    P[:, :, 0::2] = torch.sin(X)
    P[:, :, 1::2] = torch.cos(X)
    return P


class FFN(nn.Module):
    def __init__(self, d, f):
        super().__init__()
        self.dense1, self.dense2 = nn.Linear(d, f), nn.Linear(f, d)

    def forward(self, x):
        return self.dense2(torch.relu(self.dense1(x)))


class AddNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)

    def forward(self, x, y):
        return self.ln(y + x)


class EncoderBlock(nn.Module):
    def __init__(self, d, f, heads):
        super().__init__()
        self.attention = MultiHeadAttention(d, heads)
        self.addnorm1 = AddNorm(d)
        self.ffn = FFN(d, f)
        self.addnorm2 = AddNorm(d)

    def forward(self, x, valid_lens):
        y = self.addnorm1(x, self.attention(x, x, x, valid_lens))
        return self.addnorm2(y, self.ffn(y))


class DecoderBlock(nn.Module):
    def __init__(self, d, f, heads):
        super().__init__()
        self.attention1 = MultiHeadAttention(d, heads)
        self.addnorm1 = AddNorm(d)
        self.attention2 = MultiHeadAttention(d, heads)
        self.addnorm2 = AddNorm(d)
        self.ffn = FFN(d, f)
        self.addnorm3 = AddNorm(d)

    def forward(self, x, enc, enc_valid):
        B, T, _ = x.shape
        dec_valid = torch.arange(1, T + 1).repeat(B, 1)  # the book's training-time mask
        y = self.addnorm1(x, self.attention1(x, x, x, dec_valid))
        z = self.addnorm2(y, self.attention2(y, enc, enc, enc_valid))
        return self.addnorm3(z, self.ffn(z))


class Transformer(nn.Module):
    def __init__(self, src_vocab, tgt_vocab, d, f, heads, layers):
        super().__init__()
        self.d = d
        self.encoder = nn.Module()
        self.encoder.embedding = nn.Embedding(src_vocab, d)
        self.encoder.blks = nn.Sequential()
        for i in range(layers):
            self.encoder.blks.add_module("block%d" % i, EncoderBlock(d, f, heads))
        self.decoder = nn.Module()
        self.decoder.embedding = nn.Embedding(tgt_vocab, d)
        self.decoder.blks = nn.Sequential()
        for i in range(layers):
            self.decoder.blks.add_module("block%d" % i, DecoderBlock(d, f, heads))
        self.decoder.dense = nn.Linear(d, tgt_vocab)

    def forward(self, src, src_valid, dec_in):
        T = src.shape[1]
        x = self.encoder.embedding(src) * math.sqrt(self.d) + positional_table(T, self.d)
        for blk in self.encoder.blks:
            x = blk(x, src_valid)
        y = self.decoder.embedding(dec_in) * math.sqrt(self.d) + positional_table(dec_in.shape[1], self.d)
        for blk in self.decoder.blks:
            y = blk(y, x, src_valid)
        return self.decoder.dense(y)


class AdditiveAttention(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.W_k = nn.Linear(h, h, bias=False)
        self.W_q = nn.Linear(h, h, bias=False)
        self.w_v = nn.Linear(h, 1, bias=False)

    def forward(self, q, k, v, valid_lens):
        q, k = self.W_q(q), self.W_k(k)
        features = torch.tanh(q.unsqueeze(2) + k.unsqueeze(1))
        scores = self.w_v(features).squeeze(-1)
        return torch.bmm(masked_softmax(scores, valid_lens), v)


class Bahdanau(nn.Module):
    def __init__(self, src_vocab, tgt_vocab, e, h, layers):
        super().__init__()
        self.encoder = nn.Module()
        self.encoder.embedding = nn.Embedding(src_vocab, e)
        self.encoder.rnn = nn.GRU(e, h, layers)
        self.decoder = nn.Module()
        self.decoder.attention = AdditiveAttention(h)
        self.decoder.embedding = nn.Embedding(tgt_vocab, e)
        self.decoder.rnn = nn.GRU(e + h, h, layers)
        self.decoder.dense = nn.Linear(h, tgt_vocab)

    def forward(self, src, src_valid, dec_in):
        enc_out, state = self.encoder.rnn(self.encoder.embedding(src).permute(1, 0, 2))
        enc_out = enc_out.permute(1, 0, 2)
        outs = []
        for x in self.decoder.embedding(dec_in).permute(1, 0, 2):
            query = state[-1].unsqueeze(1)
            context = self.decoder.attention(query, enc_out, enc_out, src_valid)
            x = torch.cat((context, x.unsqueeze(1)), dim=-1)
            out, state = self.decoder.rnn(x.permute(1, 0, 2), state)
            outs.append(out)
        return self.decoder.dense(torch.cat(outs, dim=0)).permute(1, 0, 2)


def book_loss(logits, labels, valid):
    weights = sequence_mask(torch.ones_like(labels, dtype=torch.float32), valid)
    ce = nn.functional.cross_entropy(logits.permute(0, 2, 1), labels, reduction="none")
    return (ce * weights).mean(dim=1).sum()


def make(name, net, src_vocab, tgt_vocab, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    src_valid = torch.randint(2, T + 1, (B,), generator=g)
    tgt_valid = torch.randint(2, T + 1, (B,), generator=g)
    src = torch.randint(4, src_vocab, (B, T), generator=g)
    labels = torch.randint(4, tgt_vocab, (B, T), generator=g)
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
    write_safetensors(os.path.join(OUT, name + "_ref_params.safetensors"), net.state_dict())
    io = {"src": src, "src_valid": src_valid, "dec_in": dec_in, "labels": labels,
          "mask": mask, "logits": logits, "loss": loss.reshape(())}
    for pname, p in net.named_parameters():
        io["grad." + pname] = p.grad
    write_safetensors(os.path.join(OUT, name + "_ref_io.safetensors"), io)
    print(name, "loss", float(loss), "params", sum(p.numel() for p in net.parameters()))


torch.manual_seed(0)
net = Transformer(src_vocab=19, tgt_vocab=23, d=16, f=24, heads=4, layers=2)
for m in net.modules():  # make LayerNorm parameters non-trivial too
    if isinstance(m, nn.LayerNorm):
        nn.init.uniform_(m.weight, 0.5, 1.5)
        nn.init.uniform_(m.bias, -0.2, 0.2)
make("transformer", net, 19, 23, B=3, T=7, seed=1)

torch.manual_seed(1)
net = Bahdanau(src_vocab=19, tgt_vocab=23, e=12, h=16, layers=2)
make("bahdanau", net, 19, 23, B=3, T=7, seed=2)
