#!/usr/bin/python3
"""PyTorch CPU baseline for `tests/bench.sh train`.

Trains the same models as worker/models (LR, FM, DLRM-lite) on random
Criteo-shaped batches (26 categorical fields, 13 numeric features) with
PyTorch's CPU build, one thread, and prints one JSON line per (model, batch
size) with examples per second. The step is what a PyTorch user would write:
forward, binary cross-entropy, backward, and a sparse Adagrad update of the
embeddings plus Adam on the dense weights, so it does the same work as one
worker step plus the servers' optimizer step, without any communication.

Usage: torch_train.py --batch_sizes=128,512,2048 --seconds=3 [--models=lr,fm,dlrm]
"""
import argparse
import json
import sys
import time

try:
    import torch
    import torch.nn as nn
except ImportError:  # pragma: no cover
    print("torch_train.py: PyTorch is not installed (apt install python3-torch)",
          file=sys.stderr)
    sys.exit(3)

FIELDS = 26
NUMERIC = 13
VOCAB = 1000  # ids per field; the same key space as the synthetic data


class LR(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.EmbeddingBag(FIELDS * VOCAB, 1, mode="sum", sparse=True)
        self.dense = nn.Linear(NUMERIC, 1)
        nn.init.zeros_(self.w.weight)

    def forward(self, ids, x):
        return self.w(ids).squeeze(1) + self.dense(x).squeeze(1)


class FM(nn.Module):
    def __init__(self, k=8):
        super().__init__()
        self.w = nn.Embedding(FIELDS * VOCAB, 1 + k, sparse=True)
        self.dense = nn.Linear(NUMERIC, 1)
        nn.init.normal_(self.w.weight, std=0.01)

    def forward(self, ids, x):
        e = self.w(ids)                     # B x F x (1 + k)
        linear = e[:, :, 0].sum(1)
        v = e[:, :, 1:]
        s = v.sum(1)
        pair = 0.5 * (s * s - (v * v).sum(1)).sum(1)
        return linear + pair + self.dense(x).squeeze(1)


class DLRM(nn.Module):
    def __init__(self, d=16, bottom=64, top=64):
        super().__init__()
        self.emb = nn.EmbeddingBag(FIELDS * VOCAB, d, mode="sum", sparse=True)
        nn.init.normal_(self.emb.weight, std=0.01)
        self.bottom = nn.Sequential(nn.Linear(NUMERIC, bottom), nn.ReLU(),
                                    nn.Linear(bottom, d), nn.ReLU())
        n = FIELDS + 1
        self.li, self.lj = torch.tril_indices(n, n, offset=-1)
        self.top = nn.Sequential(nn.Linear(d + n * (n - 1) // 2, top), nn.ReLU(),
                                 nn.Linear(top, 1))
        self.d = d

    def forward(self, ids, x):
        b = ids.shape[0]
        z = self.bottom(x)                                   # B x d
        e = self.emb(ids.reshape(-1, 1)).reshape(b, FIELDS, self.d)
        t = torch.cat([e, z.unsqueeze(1)], dim=1)            # B x n x d
        inter = torch.bmm(t, t.transpose(1, 2))[:, self.li, self.lj]
        return self.top(torch.cat([z, inter], dim=1)).squeeze(1)


def bench(name, batch, seconds):
    torch.manual_seed(1)
    model = {"lr": LR, "fm": FM, "dlrm": DLRM}[name]()
    sparse = [p for n, p in model.named_parameters() if n.startswith(("w.", "emb."))]
    dense = [p for n, p in model.named_parameters() if not n.startswith(("w.", "emb."))]
    opt_sparse = torch.optim.Adagrad(sparse, lr=0.05)
    opt_dense = torch.optim.Adam(dense, lr=0.001)
    loss_fn = nn.BCEWithLogitsLoss()
    gen = torch.Generator().manual_seed(2)
    # A pool of batches made up front so data generation is not timed.
    pool = []
    for _ in range(8):
        ids = torch.randint(0, VOCAB, (batch, FIELDS), generator=gen) + \
            torch.arange(FIELDS) * VOCAB
        x = torch.randn(batch, NUMERIC, generator=gen)
        y = (torch.rand(batch, generator=gen) < 0.25).float()
        pool.append((ids, x, y))

    def step(i):
        ids, x, y = pool[i % len(pool)]
        opt_sparse.zero_grad()
        opt_dense.zero_grad()
        loss = loss_fn(model(ids, x), y)
        loss.backward()
        opt_sparse.step()
        opt_dense.step()

    for i in range(5):
        step(i)
    steps = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        step(steps)
        steps += 1
    elapsed = time.perf_counter() - start
    return steps * batch / elapsed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch_sizes", default="128,512,2048")
    ap.add_argument("--models", default="lr,fm,dlrm")
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for name in args.models.split(","):
        for b in [int(v) for v in args.batch_sizes.split(",")]:
            eps = bench(name, b, args.seconds)
            print(json.dumps({"bench": "train", "metric": f"torch_{name}_b{b}_examples_per_s_per_core",
                              "value": round(eps), "unit": "examples/s",
                              "baseline": None, "ratio": None,
                              "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
