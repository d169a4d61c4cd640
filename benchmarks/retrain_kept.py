"""Retrain kept runs of a committed study exactly as they ran (their config.json), to ship their final adapters.

`python benchmarks/retrain_kept.py results/confirm/runs/geneval/seed2002 ../retrain [ARM ...]`, with the checkout
that ran the study first on PYTHONPATH (to retrain with its code), trains each arm's run from its recorded config in a
fresh folder (resumable: a finished run is skipped, a started one resumes), one at a time on one thread, then prints
the kept and the retrained final held-out score side by side and writes OUT/retrain.json: per arm both finals and how
many of the run's steps logged the same numbers (every field but the timings), with the CPU and the code it ran on.
A run is one computation on one kind of CPU (the fp32 path); another kind rounds differently, and training amplifies
that. A run of the reproducible mode (its config's `reproducible`, 02b_precision) is one computation on every x86-64
CPU: each arm is retrained in the mode it ran in (a config without the field: the default mode), in this process when
it runs in that mode, else in a child process started in it."""
import inspect, json, os, subprocess, sys
from pathlib import Path

import torch

from flowgrpo_nb.config import run_config
from flowgrpo_nb.checkpoint import RunFolder, write_json
from flowgrpo_nb.precision import machine_key
try: from flowgrpo_nb.processes import REPRODUCIBLE_ENV, pinned_environment, run_pinned
except ImportError: REPRODUCIBLE_ENV = None  # a checkout older than the reproducible mode: every run is of the default
from flowgrpo_nb.study.record import code_version
from flowgrpo_nb.task import load_task
from flowgrpo_nb.train import GRPOTrainer

def retrain(kept:Path, out:Path) -> dict:
    "Train `kept`'s config in `out` (the base evaluated by the study, not here); the finished summary."
    cfg, run = run_config(kept), RunFolder(out)
    if (s := run.summary()) is not None and s['steps'] >= cfg.steps: return s
    task = load_task(cfg.reward, cfg.prompts, cfg.eval_prompts, cfg.model)
    # (a checkout older than `evaluate_base` evaluates the base model itself: the same run, a little more time)
    skip = dict(evaluate_base=False) if 'evaluate_base' in inspect.signature(GRPOTrainer).parameters else {}
    tr = GRPOTrainer(cfg, out, task=task, resume=bool(run.checkpoints()), progress=False, **skip)
    try: return tr.train()
    finally: tr.acc.end_training()

def reproducible(kept:Path) -> bool:
    "Whether `kept` ran in the reproducible mode (a config without the field, or a checkout without it: no)."
    return bool(getattr(run_config(kept), 'reproducible', False))

def retrain_in_its_mode(kept:Path, out:Path) -> dict:
    """`retrain` in this process when it runs in the mode `kept` ran in (reproducible or default), else in a child
    process started in that mode; the finished summary."""
    if REPRODUCIBLE_ENV is None or reproducible(kept) == pinned_environment(): return retrain(kept, out)
    args = [__file__, '--one', kept, out]
    if reproducible(kept): r = run_pinned(args)
    else: r = subprocess.run([sys.executable, *map(str, args)], env={
        k: v for k, v in os.environ.items() if REPRODUCIBLE_ENV.get(k) != v})  # the default: the CPU's own kernels
    if r.returncode: raise SystemExit(f"retraining {kept} in a child process failed (exit status {r.returncode})")
    return RunFolder(out).summary()

TIMINGS = ('sec_', 'cpu_', 'wall')  # what a step logs that is a measurement of the machine, not of the computation

def same_steps(kept:Path, new:Path) -> tuple[int, int]:
    "(steps whose logged numbers are the same in both runs' metrics.jsonl, timings aside; the kept run's steps)."
    rows = lambda d: [json.loads(l) for l in (d/'metrics.jsonl').read_text().splitlines() if l.strip()]
    a, b = rows(kept), rows(new)
    same = sum(all(x.get(k) == y.get(k) for k in x.keys() | y.keys() if not k.startswith(TIMINGS))
               for x, y in zip(a, b))
    return same, len(a)

if __name__ == '__main__':
    torch.set_num_threads(1)
    if sys.argv[1:2] == ['--one']: retrain(Path(sys.argv[2]), Path(sys.argv[3])); sys.exit(0)  # a child of one mode
    seed_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    m, rows = machine_key(), []
    for arm in sys.argv[3:] or sorted(p.name for p in seed_dir.iterdir()):
        s = retrain_in_its_mode(seed_dir/arm, out/arm)
        k = json.loads((seed_dir/arm/'summary.json').read_text())['final']['eval_overall']
        r = s['final']['eval_overall']
        same, steps = same_steps(seed_dir/arm, out/arm)
        mode = 'reproducible' if reproducible(seed_dir/arm) else 'default'
        rows.append(dict(arm=arm, mode=mode, kept=k, retrained=r, diff=r - k, same_steps=same, steps=steps))
        print(f"{arm} ({mode} mode): kept {k:.6f} retrained {r:.6f} diff {r - k:+.2e}; {same} of {steps} steps logged "
              "the same numbers", flush=True)
    # the kept runs named from the repository's root (a committed file holds no path of one machine)
    root = Path(__file__).resolve().parent.parent
    kept = seed_dir.resolve().relative_to(root).as_posix() if seed_dir.resolve().is_relative_to(root) else seed_dir.name
    write_json(out/'retrain.json', dict(kept=kept, cpu=m['cpu'], capability=m['capability'], torch=m['torch'],
                                        threads=1, code=code_version(), rows=rows))
