#!/usr/bin/python3
"""PyTorch baselines for `tests/bench.sh train`.

Trains the same models as worker/models (LR, FM, DLRM-lite) on random
Criteo-shaped batches (26 categorical fields, 13 numeric features) and prints
one JSON line per (model, batch size) with examples per second. The step is
what a PyTorch user would write: forward, binary cross-entropy, backward, and
a sparse Adagrad update of the embeddings plus Adam on the dense weights, so
it does the same work as one worker step plus the servers' optimizer step,
without any communication.

--device=cpu (default): one thread (torch.set_num_threads(1)); metrics
  torch_<model>_b<B>_examples_per_s_per_core.
--device=cuda: the model, its optimizer state and every step on the GPU;
  each batch is copied from host memory in its step, as a data loader's
  would be (the parameter server's GPU worker copies its batch too); the
  clock stops after torch.cuda.synchronize(). Metrics
  torch_gpu_<model>_b<B>_examples_per_s. Exit status 3 without a GPU.

Usage: torch_train.py --batch_sizes=128,512,2048 --seconds=3 [--models=lr,fm,dlrm]
                      [--device=cpu|cuda]
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
        li, lj = torch.tril_indices(n, n, offset=-1)
        # Buffers, so that .to(device) moves them with the weights.
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)
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


def bench(name, batch, seconds, device):
    torch.manual_seed(1)
    model = {"lr": LR, "fm": FM, "dlrm": DLRM}[name]().to(device)
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

    cuda = device.type == "cuda"
    if cuda:  # page-locked, so the per-step copies run at full speed
        pool = [tuple(t.pin_memory() for t in batch_tensors) for batch_tensors in pool]

    def step(i):
        ids, x, y = (t.to(device, non_blocking=True) for t in pool[i % len(pool)])
        opt_sparse.zero_grad()
        opt_dense.zero_grad()
        loss = loss_fn(model(ids, x), y)
        loss.backward()
        opt_sparse.step()
        opt_dense.step()

    for i in range(5):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    steps = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        step(steps)
        steps += 1
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return steps * batch / elapsed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch_sizes", default="128,512,2048")
    ap.add_argument("--models", default="lr,fm,dlrm")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("torch_train.py: no usable GPU for --device=cuda", file=sys.stderr)
        sys.exit(3)
    torch.set_num_threads(1)
    device = torch.device(args.device)
    suffix = "examples_per_s" if device.type == "cuda" else "examples_per_s_per_core"
    prefix = "torch_gpu" if device.type == "cuda" else "torch"
    for name in args.models.split(","):
        for b in [int(v) for v in args.batch_sizes.split(",")]:
            eps = bench(name, b, args.seconds, device)
            print(json.dumps({"bench": "train", "metric": f"{prefix}_{name}_b{b}_{suffix}",
                              "value": round(eps), "unit": "examples/s",
                              "baseline": None, "ratio": None,
                              "torch": torch.__version__,
                              "device": torch.cuda.get_device_name() if device.type == "cuda"
                              else "cpu"}), flush=True)


if __name__ == "__main__":
    main()
