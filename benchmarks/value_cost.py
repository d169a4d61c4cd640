"""What a latent-valued credit costs beside Flow-GRPO's and DenseGRPO's: CPU seconds and NFE per training step.

Trains flow_grpo, dense and dense_latent side by side on the embedded default (the shipped tiny model, the partial
credit task, each preset's sizes), one step of each in turn so that a busy machine slows all three alike, the same
seed for each. DenseGRPO's one-off calibration of psi(k) is left out (`calibrate=False`: a step costs the same NFE
either way). Prints a table of each method's process-CPU seconds per step (median, quartiles, range over the timed
steps, after `warmup` untimed ones) and its NFE per sample: the generator's (rollout + step values) and, for the
latent value, the value network's own evaluations and GFLOPs apart. Writes the table to `--out` (JSON), which the
README's methods table reads.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/value_cost.py --steps 8 --out results/value_cost/cost.json
"""
import statistics, tempfile, time
from pathlib import Path

import torch
from fastcore.script import call_parse

from flowgrpo_nb.checkpoint import write_json
from flowgrpo_nb.config import preset_config
from flowgrpo_nb.precision import cpu_name
from flowgrpo_nb.train import GRPOTrainer

METHODS = ('flow_grpo', 'dense', 'dense_latent')

def spread(xs:list[float]) -> dict:
    "Median, quartiles and range of `xs`."
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return dict(median=statistics.median(xs), q25=q[0], q75=q[2], min=min(xs), max=max(xs), n=len(xs))

@call_parse
def main(steps:int=8,            # timed optimizer steps per method
         warmup:int=1,           # untimed steps first
         seed:int=0,             # the runs' seed (the same for each)
         threads:int=1,          # torch CPU threads
         methods:str=','.join(METHODS),  # presets, comma-separated
         out:str=None):          # JSON file to write (default: print only)
    "Print (and write) each preset's CPU seconds and NFE per training step on the embedded default."
    torch.set_num_threads(threads)
    names = [m.strip() for m in methods.split(',') if m.strip()]
    rows = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {n: GRPOTrainer(preset_config(n, seed=seed, calibrate=False, eval_images=0, log_with='none'),
                                   Path(tmp)/n, progress=False, evaluate_base=False) for n in names}
        try:
            for s in range(warmup + steps):
                for n, tr in trainers.items():
                    m = tr.train_step()
                    if s >= warmup: rows[n].append(m)
        finally:
            for tr in trainers.values():
                if tr.lock is not None: tr.lock.release()
    table = {}
    for n, ms in rows.items():
        cfg = trainers[n].cfg
        med = lambda k: statistics.median(m.get(k, 0.0) for m in ms)
        table[n] = dict(preset=n, method=cfg.method, lookahead=cfg.lookahead, K=cfg.K, batch=cfg.batch_size,
                        cpu_step=spread([m['cpu_step'] for m in ms]), cpu_values=spread([m['cpu_values'] for m in ms]),
                        nfe_generator=med('nfe_rollout') + med('nfe_lookahead'), nfe_train=med('nfe_train'),
                        nfe_value=med('nfe_value'), value_gflops=med('value_flops') / 1e9,
                        loss_finite=all(torch.isfinite(torch.tensor(m['loss'])) for m in ms))
    res = dict(cpu=cpu_name(), threads=threads, torch=torch.__version__, steps=steps, warmup=warmup, seed=seed,
               written=time.strftime('%Y-%m-%d'), methods=table)
    ref = table[names[0]]['cpu_step']['median']
    print(f"CPU seconds per training step on the embedded default: {res['cpu']}, {threads} thread(s), torch "
          f"{res['torch']}, median of {steps} steps after {warmup}, one step of each method in turn")
    print(f"{'preset':<14} {'CPU s/step':>10} {'[q25, q75]':>16} {'x ' + names[0]:>12} {'gen. NFE':>9} "
          f"{'value evals':>11} {'value GFLOP':>11}")
    for n, r in table.items():
        c = r['cpu_step']
        iqr = f"[{c['q25']:.3f}, {c['q75']:.3f}]"
        print(f"{n:<14} {c['median']:>10.3f} {iqr:>16} {c['median'] / ref:>12.2f} "
              f"{r['nfe_generator']:>9g} {r['nfe_value']:>11g} {r['value_gflops']:>11.3f}")
    if out: print(f"written: {write_json(out, res)}")
