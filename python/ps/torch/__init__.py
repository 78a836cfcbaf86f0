"""ps.torch: train a PyTorch model whose embeddings live on the servers.

    import ps, ps.torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = ps.torch.EmbeddingBag("emb", embedding_dim=8, mode="sum")
            self.mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        def forward(self, keys):                      # keys: int64 (B, L)
            return self.mlp(self.emb(keys)).squeeze(1)

    sess = ps.init("job.pbtxt")
    model = Net()
    trainer = ps.torch.Trainer(sess, model)           # dense params -> the job's dense table
    for batch in sess.batches(batches_of):
        loss = F.binary_cross_entropy_with_logits(model(keys), labels)  # mean loss
        trainer.step(loss)                            # pushes, then sess.end_step()
    if sess.finish():                                 # True on the evaluator
        evaluate(model)                               # the servers' final dense values
        trainer.export("model.pt")                    # the same values, and the rows
    sess.close()
    scorer = ps.torch.load_for_inference("model.pt", Net)   # no servers needed

Embedding modules pull only the batch's distinct keys; the trainer pushes
one summed gradient per distinct key per table. The servers own the
optimizer (set per table in the job config): no torch.optim optimizer.
"""

from .embedding import Embedding, EmbeddingBag, TableModule, as_id_tensor, table_modules
from .inference import LocalEmbedding, LocalEmbeddingBag, LocalTable, load_for_inference
from .trainer import TABLE_PREFIX, Trainer

__all__ = [
    "Embedding", "EmbeddingBag", "LocalEmbedding", "LocalEmbeddingBag", "LocalTable",
    "TABLE_PREFIX", "TableModule", "Trainer", "as_id_tensor", "load_for_inference",
    "table_modules",
]
