"""A ps.torch worker process: trains helpers/torch_ctr.py's model on its
interleaved shard of the job's synthetic CTR data at batch size argv[2]
(one epoch), and the evaluator exports the model to argv[3].

    torch_bsp_worker.py CONFIG BATCH_SIZE EXPORT_PATH

The scheduler comes from $PS_SCHEDULER (ps.testing.LocalCluster.python_worker).
Prints "steps N nonfinite M" on stdout.
"""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import ps  # noqa: E402
import ps.data  # noqa: E402
import ps.torch  # noqa: E402

from helpers import torch_ctr  # noqa: E402


def main() -> int:
    config, batch_size, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    sess = ps.init(config)
    model = torch_ctr.ps_net()
    trainer = ps.torch.Trainer(sess, model, "dense")
    data = ps.data.SyntheticCtr(config)
    k = sess.num_workers
    for batch in sess.batches(lambda shard, epoch: data.shard_batches(shard, k, batch_size)):
        trainer.step(torch_ctr.loss_of(model, batch))
    print(f"steps {trainer.steps} nonfinite {trainer.nonfinite_steps}", flush=True)
    if sess.finish():
        trainer.export(out)
    sess.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
