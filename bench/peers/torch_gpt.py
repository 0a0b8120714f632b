#!/usr/bin/env python3
"""The PyTorch twin of examples/gpt (qkv-gpt): the same data (the English
side of examples/data/fra-eng/fra.txt.gz, characters, the last 5 % of lines
held out), the same model (pre-LN blocks, causal self-attention with biased
W_q/W_k/W_v/W_o projections, GELU MLP of width 4·d, final LayerNorm, learned
position embeddings, output tied to the token embedding: logits = h · wteᵀ,
N(0, 0.02²) weights and zero biases), the same training (AdamW, weight decay
on tensors of rank ≥ 2 only, linear warm-up then cosine decay to lr/10 as
qkv_schedule_new_warmup_decay, clip_grad_norm_ at --clip, mean cross-entropy
over random windows), the same options and the same report lines. The
batches differ (another generator), so the losses agree in distribution, not
digit for digit.

The lines between "# --- model" and "# --- end" are the model and its
training, the part examples/gpt/README.md compares with qkv-gpt's model.c.
"""
import argparse
import gzip
import math
import os
import re
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def load_corpus(path, max_lines, val_share=0.05):
    lines = []
    with gzip.open(path, 'rt', encoding='utf-8') as f:
        for line in f:
            if max_lines and len(lines) >= max_lines:
                break
            lines.append(re.split(r'[\t\r\n]', line, 1)[0])
    chars = sorted(set(''.join(lines)) | {'\n'})
    index = {c: i for i, c in enumerate(chars)}
    n_val = int(len(lines) * val_share)
    def encode(ls):
        return torch.tensor([index[c] for c in ''.join(l + '\n' for l in ls)])
    return chars, encode(lines[:len(lines) - n_val]), encode(lines[len(lines) - n_val:])


# --- model and training
class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d, d) for _ in range(4))
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def attention(self, h):
        B, T, d = h.shape
        q, k, v = (w(h).view(B, T, self.heads, -1).transpose(1, 2)
                   for w in (self.W_q, self.W_k, self.W_v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        causal = torch.ones(T, T, dtype=torch.bool).triu(1)
        a = scores.masked_fill(causal, float('-inf')).softmax(-1) @ v
        return self.W_o(a.transpose(1, 2).reshape(B, T, d))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, block, d, layers, heads):
        super().__init__()
        self.wte = nn.Parameter(torch.randn(vocab, d) * 0.02)
        self.wpe = nn.Parameter(torch.randn(block, d) * 0.02)
        self.blocks = nn.Sequential(*(Block(d, heads) for _ in range(layers)))
        self.ln_f = nn.LayerNorm(d)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, ids):
        x = self.wte[ids] + self.wpe[:ids.shape[1]]
        return self.ln_f(self.blocks(x)) @ self.wte.T  # tied output


def sample_batch(ids, block, n, gen):
    starts = torch.randint(0, len(ids) - block, (n,), generator=gen)
    x = torch.stack([ids[s:s + block] for s in starts])
    y = torch.stack([ids[s + 1:s + block + 1] for s in starts])
    return x, y


def loss_of(model, x, y):
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten())


@torch.no_grad()
def validation_loss(model, ids, a):
    gen = torch.Generator().manual_seed(12345)  # the same windows every time
    return sum(loss_of(model, *sample_batch(ids, a.block, a.batch, gen)).item()
               for _ in range(8)) / 8


def lr_at(t, a):  # t: the updates made before this one
    if t < a.warmup:
        return a.lr * t / a.warmup
    p = min(1.0, (t - a.warmup) / max(1, a.steps - a.warmup))
    return a.lr / 10 + (a.lr - a.lr / 10) * (1 + math.cos(math.pi * p)) / 2


def train(model, train_ids, val_ids, a):
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{'params': matrices, 'weight_decay': a.weight_decay},
                             {'params': rest, 'weight_decay': 0.0}], lr=a.lr)
    gen = torch.Generator().manual_seed(a.seed)
    total, n, elapsed = 0.0, 0, 0.0
    for step in range(1, a.steps + 1):
        x, y = sample_batch(train_ids, a.block, a.batch, gen)
        start = time.perf_counter()
        for group in opt.param_groups:
            group['lr'] = lr_at(step - 1, a)
        loss = loss_of(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        elapsed += time.perf_counter() - start
        total, n = total + loss.item(), n + 1
        if step % a.eval_every == 0 or step == a.steps:
            val = validation_loss(model, val_ids, a)
            print(f'step {step:5d}  train loss {total / n:.4f}  val loss {val:.4f}  '
                  f'{elapsed * 1e3 / step:.2f} ms/step', flush=True)
            total, n = 0.0, 0
# --- end


# --- generation
@torch.no_grad()
def generate(model, ids, length, temperature, block):
    for _ in range(length):
        logits = model(ids[None, -block:])[0, -1]
        probs = (logits / temperature).softmax(-1)
        ids = torch.cat([ids, torch.multinomial(probs, 1)])
    return ids
# --- end


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--data', default=os.path.join(here, '..', '..', 'examples', 'data',
                                                  'fra-eng', 'fra.txt.gz'))
    for name, default in [('steps', 1000), ('threads', 1), ('d-model', 64), ('layers', 2),
                          ('heads', 4), ('block', 32), ('batch', 16), ('warmup', 100),
                          ('eval-every', 100), ('max-lines', 0), ('seed', 0), ('length', 200)]:
        p.add_argument('--' + name, type=int, default=default)
    for name, default in [('lr', 3e-3), ('weight-decay', 0.1), ('clip', 1.0),
                          ('temperature', 0.8)]:
        p.add_argument('--' + name, type=float, default=default)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    chars, train_ids, val_ids = load_corpus(a.data, a.max_lines)
    model = GPT(len(chars), a.block, a.d_model, a.layers, a.heads)
    print(f'{len(chars)} characters, block {a.block}, d_model {a.d_model}, {a.layers} layers, '
          f'{a.heads} heads: {sum(p.numel() for p in model.parameters())} parameters')
    print(f'{len(train_ids)} training and {len(val_ids)} held-out characters')
    model.train()
    train(model, train_ids, val_ids, a)
    out = generate(model, torch.tensor([chars.index('\n')]), a.length, a.temperature, a.block)
    print('--- sample ---' + ''.join(chars[i] for i in out.tolist()))


if __name__ == '__main__':
    main()
