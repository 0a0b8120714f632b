#!/usr/bin/python3
"""The book's PyTorch Transformer, translated two ways after training.

    /usr/bin/python3 bench/d2l-decode-positions.py SEED

Trains exactly as ../shared/reference/d2l/d2l017.py transformer SEED does (its
code runs unchanged up to the translations), then translates the book's four
sentences twice:

- "book": the book's predict_seq2seq. In its incremental decoder every new
  token gets position 0's encoding (PositionalEncoding adds P[:, :1] to a
  one-token input), although training gave token t position t.
- "true": the same greedy decoder with token t given position t's encoding
  (the cached keys and values make this equal to rerunning the causal
  decoder over the whole prefix, which is what qkv-seq2seq does).

and prints, for each, the lines "ENG => FRA, bleu B" as d2l017.py does,
headed "# decode book" and "# decode true". Used by bench/seeds.py --which
torch-true to put PyTorch's numbers on qkv's footing.
"""
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
D2L = os.path.join(HERE, "..", "..", "shared", "reference", "d2l", "d2l017.py")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: d2l-decode-positions.py SEED")
    source = open(D2L, encoding="utf-8").read()
    cut = source.index("engs = [")  # the script's own translations start here
    sys.argv = [D2L, "transformer", sys.argv[1]]
    scope = {"__file__": D2L, "__name__": "d2l017"}
    exec(compile(source[:cut], D2L, "exec"), scope)
    torch = scope["torch"]
    net = scope["net"]
    decoder = net.decoder

    def forward_true_positions(X, state):
        # position of X's first token = tokens already cached by block 0
        cached = state[2][0]
        offset = 0 if cached is None else cached.shape[1]
        pe = decoder.pos_encoding
        X = decoder.embedding(X) * math.sqrt(decoder.num_hiddens)
        X = pe.dropout(X + pe.P[:, offset:offset + X.shape[1], :].to(X.device))
        for blk in decoder.blks:
            X, state = blk(X, state)
        return decoder.dense(X), state

    engs = ["go .", "i lost .", "he's calm .", "i'm home ."]
    fras = ["va !", "j'ai perdu .", "il est calme .", "je suis chez moi ."]
    book_forward = decoder.forward
    for mode in ("book", "true"):
        decoder.forward = book_forward if mode == "book" else forward_true_positions
        print(f"# decode {mode}")
        with torch.no_grad():
            for eng, fra in zip(engs, fras):
                out = scope["predict_seq2seq"](net, eng, scope["src_vocab"], scope["tgt_vocab"],
                                               scope["num_steps"])
                print(f"{eng} => {out}, bleu {scope['bleu'](out, fra, k=2):.3f}", flush=True)


if __name__ == "__main__":
    main()
