#!/usr/bin/python3
"""Reference data for tests/test-luong.c: a GRU seq2seq with Luong attention
(Luong, Pham & Manning 2015) defined in PyTorch, the way graph/luong.c builds
it (include/qkv/qkv-builders-attention.h and qkv-builders-models.h document
the model), with random weights and no dropout.

For each variant it writes two safetensors files under tests/data/:
  luong_<variant>_ref_params.safetensors   the state_dict
  luong_<variant>_ref_io.safetensors       one batch — src (B,S) i32,
                                           src_valid (B) i32, dec_in and
                                           labels (B,T) i32, tgt_valid (B)
                                           i32 — the logits, the attention
                                           weights, the book's loss
                                           (MaskedSoftmaxCELoss summed) and
                                           every parameter's gradient as
                                           "grad.<name>".

The source is longer than the target (S = 7, T = 6) so that the two lengths
cannot be confused, and the valid lengths vary, so that local-m meets targets
past the end of their source.

Run: /usr/bin/python3 tests/reference/luong_ref.py
"""
import json
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


class LuongAttention(nn.Module):
    def __init__(self, h, score, align, window):
        super().__init__()
        self.score, self.align, self.D = score, align, window
        if score == "general":
            self.W_a = nn.Linear(h, h, bias=False)
        elif score == "concat":
            self.W_a = nn.Linear(2 * h, h, bias=False)
            self.v_a = nn.Linear(h, 1, bias=False)
        if align == "local-p":
            self.W_p = nn.Linear(h, h, bias=False)
            self.v_p = nn.Linear(h, 1, bias=False)

    def forward(self, q, src, valid, first):
        B, n, _ = q.shape
        S = src.shape[1]
        if self.score == "dot":
            scores = torch.bmm(q, src.transpose(1, 2))
        elif self.score == "general":
            scores = torch.bmm(q, self.W_a(src).transpose(1, 2))
        else:  # the paper's form: W_a applied to the concatenation itself
            pairs = torch.cat((q.unsqueeze(2).expand(-1, -1, S, -1),
                               src.unsqueeze(1).expand(-1, n, -1, -1)), dim=-1)
            scores = self.v_a(torch.tanh(self.W_a(pairs))).squeeze(-1)
        positions = torch.arange(S, dtype=torch.float32)[None, None, :]
        keep = positions < valid[:, None, None]
        if self.align != "global":
            length = valid.float()[:, None, None]  # S: each sentence's length
            if self.align == "local-m":
                t = torch.arange(first, first + n, dtype=torch.float32)[None, :, None]
                centre = torch.minimum(t, length - 1)
            else:
                centre = length * torch.sigmoid(self.v_p(torch.tanh(self.W_p(q))))
            offset = positions - centre
            keep = keep & (offset.abs() <= self.D)
        w = torch.softmax(scores.masked_fill(~keep, -1e6), dim=-1)
        if self.align == "local-p":
            sigma = self.D / 2
            w = w * torch.exp(-offset ** 2 / (2 * sigma ** 2))
        return torch.bmm(w, src), w


class Luong(nn.Module):
    def __init__(self, src_vocab, tgt_vocab, e, h, layers, score, align, window, feed):
        super().__init__()
        self.feed, self.h = feed, h
        self.encoder = nn.Module()
        self.encoder.embedding = nn.Embedding(src_vocab, e)
        self.encoder.rnn = nn.GRU(e, h, layers)
        self.decoder = nn.Module()
        self.decoder.embedding = nn.Embedding(tgt_vocab, e)
        self.decoder.rnn = nn.GRU(e + (h if feed else 0), h, layers)
        self.decoder.attention = LuongAttention(h, score, align, window)
        self.decoder.W_c = nn.Linear(2 * h, h, bias=False)
        self.decoder.dense = nn.Linear(h, tgt_vocab)

    def forward(self, src, src_valid, dec_in):
        enc, state = self.encoder.rnn(self.encoder.embedding(src).permute(1, 0, 2))
        enc = enc.permute(1, 0, 2)
        x = self.decoder.embedding(dec_in)
        d = self.decoder
        if not self.feed:
            out, _ = d.rnn(x.permute(1, 0, 2), state)
            h = out.permute(1, 0, 2)
            context, w = d.attention(h, enc, src_valid, 0)
            att = torch.tanh(d.W_c(torch.cat((context, h), dim=-1)))
        else:
            prev = torch.zeros(x.shape[0], self.h)
            atts, ws = [], []
            for t in range(x.shape[1]):
                out, state = d.rnn(torch.cat((x[:, t], prev), dim=-1).unsqueeze(0), state)
                h = out.permute(1, 0, 2)
                context, w = d.attention(h, enc, src_valid, t)
                a = torch.tanh(d.W_c(torch.cat((context, h), dim=-1)))
                atts.append(a)
                ws.append(w)
                prev = a.squeeze(1)
            att, w = torch.cat(atts, 1), torch.cat(ws, 1)
        return d.dense(att), w


def book_loss(logits, labels, valid):
    weights = (torch.arange(labels.shape[1])[None, :] < valid[:, None]).float()
    ce = nn.functional.cross_entropy(logits.permute(0, 2, 1), labels, reduction="none")
    return (ce * weights).mean(dim=1).sum()


def make(name, score, align, window, feed, seed):
    V_src, V_tgt, E, H, L, B, S, T = 13, 11, 8, 10, 2, 3, 7, 6
    torch.manual_seed(seed)
    net = Luong(V_src, V_tgt, E, H, L, score, align, window, feed)
    g = torch.Generator().manual_seed(seed + 100)
    src_valid = torch.tensor([S, 2, 4])
    tgt_valid = torch.randint(2, T + 1, (B,), generator=g)
    src = torch.randint(4, V_src, (B, S), generator=g)
    labels = torch.randint(4, V_tgt, (B, T), generator=g)
    for b in range(B):
        src[b, src_valid[b] - 1] = 3
        src[b, src_valid[b]:] = 1
        labels[b, tgt_valid[b] - 1] = 3
        labels[b, tgt_valid[b]:] = 1
    dec_in = torch.cat([torch.full((B, 1), 2), labels[:, :-1]], 1)
    logits, weights = net(src, src_valid, dec_in)
    loss = book_loss(logits, labels, tgt_valid)
    loss.backward()
    base = os.path.join(OUT, "luong_" + name)
    write_safetensors(base + "_ref_params.safetensors", net.state_dict())
    io = {"src": src, "src_valid": src_valid, "dec_in": dec_in, "labels": labels,
          "tgt_valid": tgt_valid, "logits": logits, "weights": weights,
          "loss": loss.reshape(())}
    for pname, p in net.named_parameters():
        io["grad." + pname] = p.grad
    write_safetensors(base + "_ref_io.safetensors", io)
    print(name, "loss", float(loss), "params", sum(p.numel() for p in net.parameters()))


# name, score, alignment, D, input feeding, seed
VARIANTS = [
    ("dot", "dot", "global", 0, False, 11),
    ("general", "general", "global", 0, False, 12),
    ("concat", "concat", "global", 0, False, 13),
    ("concat_feed", "concat", "global", 0, True, 14),
    ("local_m", "general", "local-m", 1, False, 15),
    ("local_m_feed", "dot", "local-m", 2, True, 16),
    ("local_p", "general", "local-p", 2, False, 17),
    ("local_p_feed", "concat", "local-p", 2, True, 18),
]

if __name__ == "__main__":
    for v in VARIANTS:
        make(*v)
