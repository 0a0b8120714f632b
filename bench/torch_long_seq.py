#!/usr/bin/python3
"""PyTorch's side of the long-sequence benchmark (bench/long_seq.py): the
book's TransformerEncoderBlock (d2l 11.7: MultiHeadAttention without biases,
DotProductAttention with masked_softmax, AddNorm, PositionWiseFFN) written
with torch.nn as the book does, at d_model 512, 8 heads, FFN 2048, batch 1,
causal self-attention as the book's decoder makes it (valid_lens
1, 2, ..., T per query), no dropout, trained with Adam on loss = sum(out * w).

    /usr/bin/python3 bench/torch_long_seq.py --T 2048 --threads 1 --steps 3

Prints one JSON line like qkv-bench-long's; a run that does not fit in the
memory it is allowed (bench/long_seq.py sets an address-space limit) prints
one with "error" and exits with status 3.
"""
import argparse
import json
import math
import resource
import statistics
import sys
import time

D_MODEL, HEADS, FFN = 512, 8, 2048


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args()
    out = {"impl": "torch", "T": args.T, "threads": args.threads, "steps": args.steps}
    try:
        import torch
        from torch import nn

        torch.set_num_threads(args.threads)
        torch.manual_seed(0)
        out["torch"] = torch.__version__

        def sequence_mask(X, valid_len, value=0):
            maxlen = X.size(1)
            mask = torch.arange((maxlen), dtype=torch.float32, device=X.device)[None, :] < valid_len[:, None]
            X[~mask] = value
            return X

        def masked_softmax(X, valid_lens):
            if valid_lens is None:
                return nn.functional.softmax(X, dim=-1)
            shape = X.shape
            if valid_lens.dim() == 1:
                valid_lens = torch.repeat_interleave(valid_lens, shape[1])
            else:
                valid_lens = valid_lens.reshape(-1)
            X = sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
            return nn.functional.softmax(X.reshape(shape), dim=-1)

        class DotProductAttention(nn.Module):
            def __init__(self, dropout):
                super().__init__()
                self.dropout = nn.Dropout(dropout)

            def forward(self, queries, keys, values, valid_lens=None):
                d = queries.shape[-1]
                scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
                self.attention_weights = masked_softmax(scores, valid_lens)
                return torch.bmm(self.dropout(self.attention_weights), values)

        class MultiHeadAttention(nn.Module):
            def __init__(self, num_hiddens, num_heads, dropout, bias=False):
                super().__init__()
                self.num_heads = num_heads
                self.attention = DotProductAttention(dropout)
                self.W_q = nn.Linear(num_hiddens, num_hiddens, bias=bias)
                self.W_k = nn.Linear(num_hiddens, num_hiddens, bias=bias)
                self.W_v = nn.Linear(num_hiddens, num_hiddens, bias=bias)
                self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)

            def transpose_qkv(self, X):
                X = X.reshape(X.shape[0], X.shape[1], self.num_heads, -1)
                X = X.permute(0, 2, 1, 3)
                return X.reshape(-1, X.shape[2], X.shape[3])

            def transpose_output(self, X):
                X = X.reshape(-1, self.num_heads, X.shape[1], X.shape[2])
                X = X.permute(0, 2, 1, 3)
                return X.reshape(X.shape[0], X.shape[1], -1)

            def forward(self, queries, keys, values, valid_lens):
                queries = self.transpose_qkv(self.W_q(queries))
                keys = self.transpose_qkv(self.W_k(keys))
                values = self.transpose_qkv(self.W_v(values))
                if valid_lens is not None:
                    valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)
                output = self.attention(queries, keys, values, valid_lens)
                return self.W_o(self.transpose_output(output))

        class AddNorm(nn.Module):
            def __init__(self, norm_shape, dropout):
                super().__init__()
                self.dropout = nn.Dropout(dropout)
                self.ln = nn.LayerNorm(norm_shape)

            def forward(self, X, Y):
                return self.ln(self.dropout(Y) + X)

        class PositionWiseFFN(nn.Module):
            def __init__(self, ffn_num_hiddens, ffn_num_outputs):
                super().__init__()
                self.dense1 = nn.Linear(D_MODEL, ffn_num_hiddens)
                self.relu = nn.ReLU()
                self.dense2 = nn.Linear(ffn_num_hiddens, ffn_num_outputs)

            def forward(self, X):
                return self.dense2(self.relu(self.dense1(X)))

        class TransformerEncoderBlock(nn.Module):
            def __init__(self, num_hiddens, ffn_num_hiddens, num_heads, dropout, use_bias=False):
                super().__init__()
                self.attention = MultiHeadAttention(num_hiddens, num_heads, dropout, use_bias)
                self.addnorm1 = AddNorm(num_hiddens, dropout)
                self.ffn = PositionWiseFFN(ffn_num_hiddens, num_hiddens)
                self.addnorm2 = AddNorm(num_hiddens, dropout)

            def forward(self, X, valid_lens):
                Y = self.addnorm1(X, self.attention(X, X, X, valid_lens))
                return self.addnorm2(Y, self.ffn(Y))

        T = args.T
        block = TransformerEncoderBlock(D_MODEL, FFN, HEADS, 0.0)
        block.train()
        opt = torch.optim.Adam(block.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(1)
        X = torch.rand(1, T, D_MODEL, generator=gen) * 2 - 1
        W = torch.rand(1, T, D_MODEL, generator=gen) * 2 - 1
        # causal, as the book's decoder in training: query i sees keys 0..i
        valid_lens = torch.arange(1, T + 1).repeat(1, 1)
        times = []
        for s in range(args.warmup + args.steps):
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = (block(X, valid_lens) * W).sum()
            loss.backward()
            opt.step()
            dt = time.perf_counter() - t0
            if s >= args.warmup:
                times.append(dt)
            out["loss"] = float(loss)
        out["s_per_step"] = round(statistics.median(times), 4) if times else 0.0
        out["peak_rss_mib"] = round(peak_rss_mib(), 1)
    except (RuntimeError, MemoryError) as e:
        out["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:160])
        out["peak_rss_mib"] = round(peak_rss_mib(), 1)
        print(json.dumps(out), flush=True)
        sys.exit(3)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
