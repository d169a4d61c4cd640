"""Retrain kept runs of a committed study exactly as they ran (their config.json), to ship their final adapters.

`python benchmarks/retrain_kept.py results/confirm/runs/geneval/seed2002 /tmp/retrain [ARM ...]` trains each arm's
run from its recorded config in a fresh folder (resumable: a finished run is skipped, a started one resumes), one at a
time on one thread, then prints the kept and the retrained final held-out score side by side."""
import json, sys
from pathlib import Path

import torch

from flowgrpo_nb.config import run_config
from flowgrpo_nb.checkpoint import RunFolder
from flowgrpo_nb.task import load_task
from flowgrpo_nb.train import GRPOTrainer

def retrain(kept:Path, out:Path) -> dict:
    "Train `kept`'s config in `out` (the base evaluated by the study, not here); the finished summary."
    cfg, run = run_config(kept), RunFolder(out)
    if (s := run.summary()) is not None and s['steps'] >= cfg.steps: return s
    task = load_task(cfg.reward, cfg.prompts, cfg.eval_prompts, cfg.model)
    tr = GRPOTrainer(cfg, out, task=task, resume=bool(run.checkpoints()), progress=False, evaluate_base=False)
    try: return tr.train()
    finally: tr.acc.end_training()

if __name__ == '__main__':
    torch.set_num_threads(1)
    seed_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    for arm in sys.argv[3:] or sorted(p.name for p in seed_dir.iterdir()):
        s = retrain(seed_dir/arm, out/arm)
        k = json.loads((seed_dir/arm/'summary.json').read_text())['final']['eval_overall']
        print(f"{arm}: kept {k:.6f} retrained {s['final']['eval_overall']:.6f} diff {s['final']['eval_overall'] - k:+.2e}",
              flush=True)
