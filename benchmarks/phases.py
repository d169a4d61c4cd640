"""Where a training step's time goes, per phase: wall and process-CPU seconds, NFE, network rows, and the network's
achieved GFLOP/s against this machine's fp32 matmul peak, measured in the same run.

Not a test: it prints a table (`--json OUT` also writes the numbers). For each method it loads the shipped tiny
model and the default task, calibrates once (when the method calibrates), runs `--steps` training steps of the
`--budget`'s config (the comparison's `BUDGETS`), then one training-time evaluation of the budget's `eval_images`.
FLOPs per network row come from `torch.utils.flop_counter.FlopCounterMode` on one forward of the transformer (and
one forward + backward with the LoRA adapter trainable, for the rows of the update); a phase's GFLOP/s is its
network FLOPs over its wall seconds, so everything else the phase does counts against it. Phases are exclusive:
decoding + reward (images from states, and the reward) is taken out of the rollout, values and evaluation around it.
Numbers only mean something on an idle machine. Examples:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/phases.py --budget smoke --steps 1 --threads 1   # a check, < 2 min
    .venv/bin/python benchmarks/phases.py --threads 2 --steps 3 --json phases.json               # the default step
"""
import json, tempfile, time
from pathlib import Path
from collections import Counter
from contextlib import contextmanager

import torch
from fastcore.script import call_parse
from torch.utils.flop_counter import FlopCounterMode

import flowgrpo_nb.rollout as rollout_mod
import flowgrpo_nb.train as train_mod
import flowgrpo_nb.collect as collect_mod  # each method's collection times its rollout, values and credit
from flowgrpo_nb.study.design import ARMS, BUDGETS, CompareConfig

DEFAULT = ('flow_grpo', 'flow_grpo_train4', 'stepwise', 'dense', 'turning_point')
from flowgrpo_nb.task import load_policy, load_task

ORDER = ('model load', 'calibration', 'rollout', 'values', 'decoding + reward', 'credit', 'update', 'evaluation',
         'other')
TRAINER_PHASES = dict(rollout='rollout', values='values', credit='credit', update='update', step='other',
                      eval='evaluation')


class Profile:
    "Exclusive wall / CPU seconds, NFE and network rows per phase: a nested phase's time is taken out of its parent's."
    def __init__(self): self.phases, self.stack = {}, []

    def add(self, name:str, **kw): self.phases.setdefault(name, Counter()).update(kw)
    def book(self, **kw): self.add(self.stack[-1] if self.stack else 'other', **kw)

    @contextmanager
    def phase(self, name:str):
        w, c = time.perf_counter(), time.process_time()
        self.stack.append(name)
        try: yield
        finally:
            self.stack.pop()
            dw, dc = time.perf_counter() - w, time.process_time() - c
            self.add(name, wall=dw, cpu=dc)
            if self.stack: self.add(self.stack[-1], wall=-dw, cpu=-dc)


def matmul_peak(threads:int, n:int=1024, reps:int=15) -> dict:
    "fp32 GFLOP/s of n x n x n matmuls on `threads` threads: the best and the median of `reps` timed calls."
    t0 = torch.get_num_threads(); torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3): a @ b
    ts = []
    for _ in range(reps):
        w = time.perf_counter(); a @ b; ts.append(time.perf_counter() - w)
    torch.set_num_threads(t0)
    ts.sort()
    return dict(threads=threads, best=2 * n ** 3 / ts[0] / 1e9, median=2 * n ** 3 / ts[len(ts) // 2] / 1e9)


def flops_per_row(policy, params) -> tuple[int, int]:
    "FLOPs of one transformer row: forward only, and forward + backward with the adapter's parameters trainable."
    x, cond = policy.noise(1, torch.Generator().manual_seed(0)), policy.encode(['a red circle'])
    t = torch.full((1,), 0.5)
    with torch.no_grad(), FlopCounterMode(display=False) as fc: policy._velocity(x, t, cond.embeds, cond.pooled)
    fwd = fc.get_total_flops()
    with FlopCounterMode(display=False) as fc: policy._velocity(x, t, cond.embeds, cond.pooled).sum().backward()
    for p in params: p.grad = None
    return fwd, fc.get_total_flops()


@contextmanager
def instrumented(prof:Profile):
    "Book the trainer's timed phases and decoding + reward (`reward_states`) under `prof` for the duration."
    timed0, reward_states0 = train_mod.timed, rollout_mod.reward_states
    @contextmanager
    def timed(times, name):
        with timed0(times, name), prof.phase(TRAINER_PHASES.get(name, name)): yield
    def reward_states(*a, **kw):
        with prof.phase('decoding + reward'): return reward_states0(*a, **kw)
    train_mod.timed = collect_mod.timed = timed; rollout_mod.reward_states = reward_states
    try: yield
    finally: train_mod.timed = collect_mod.timed = timed0; rollout_mod.reward_states = reward_states0


def profile_method(method:str, budget:str, steps:int, out:Path,
                   task:str='geneval') -> tuple[dict, tuple[int, int], dict]:
    "({phase: totals}, FLOPs per row (forward, forward + backward), trainer per-step medians) of one method."
    cfg = CompareConfig(budget=budget, tasks=(task,)).train_config(method, 0, task)
    prof = Profile()
    with prof.phase('model load'):
        policy, task = (load_policy(cfg.model, cfg.model_path),
                        load_task(cfg.reward, cfg.prompts, cfg.eval_prompts, cfg.model))
        tr = train_mod.GRPOTrainer(cfg, out/method, policy=policy, task=task, progress=False)
    fl = flops_per_row(tr.policy, tr.params)
    def count_rows(module, args, kwargs):
        x = kwargs.get('hidden_states', args[0] if args else None)
        prof.book(**{'grad_rows' if torch.is_grad_enabled() else 'rows': x.shape[0], 'calls': 1})
    hook = tr.policy.transformer.register_forward_pre_hook(count_rows, with_kwargs=True)
    add0 = tr.policy.nfe.add
    tr.policy.nfe.add = lambda n: (prof.book(nfe=n), add0(n))[1]
    ms = []
    try:
        with instrumented(prof):
            if cfg.calibrate:
                with prof.phase('calibration'): tr.calibrate()
            for _ in range(steps): ms.append(tr.train_step())
            with prof.phase('evaluation'): tr.evaluate(BUDGETS[budget]['eval_images'])
    finally: hook.remove(); tr.policy.nfe.add = add0
    med = lambda k: float(torch.tensor([m[k] for m in ms]).median()) if ms else None
    return prof.phases, fl, dict(sec_step=med('sec_step'), cpu_step=med('cpu_step'), batch=cfg.batch_size, K=cfg.K)


@call_parse
def main(threads:int=1,        # torch CPU threads for the training steps (the peak is measured at 1, 2 and this many)
         steps:int=2,          # training steps per method
         # the comparison budget whose training config is profiled: smoke or quick (see study.design.BUDGETS)
         budget:str='quick',
         methods:str=','.join(DEFAULT),  # comma-separated arms of the comparison (flowgrpo_nb.study.design.ARMS)
         task:str='geneval',   # the comparison task whose reward trains (geneval or score)
         json_out:str=None):   # also write the numbers to this JSON file (--json OUT)
    """Print, per method and phase, wall / CPU seconds, NFE, rows and the network's GFLOP/s against the measured matmul
    peak."""
    ms = [m.strip() for m in methods.split(',') if m.strip()]
    bad = [m for m in ms if m not in ARMS]
    if bad or budget not in BUDGETS or steps < 1 or threads < 1:
        raise ValueError(f"methods={methods!r}, budget={budget!r}, steps={steps}, threads={threads}: arms from "
                         f"{', '.join(ARMS)}, budget one of {', '.join(BUDGETS)}, steps and threads at least 1")
    if task not in ('geneval', 'score'): raise ValueError(f"task={task!r}: allowed geneval or score")
    peaks = {t: matmul_peak(t) for t in sorted({1, 2, threads})}
    torch.set_num_threads(threads)
    peak = peaks[threads]['best']
    print(f"fp32 matmul 1024³ (best of 15): "
          + ', '.join(f"{t} thread(s) {p['best']:.0f} GFLOP/s (median {p['median']:.0f})" for t, p in peaks.items())
          + f"; profiling with {threads} thread(s)")
    result = dict(threads=threads, steps=steps, budget=budget, peak_gflops=peaks, methods={})
    with tempfile.TemporaryDirectory() as d:
        for m in ms:
            phases, (fwd, fb), med = profile_method(m, budget, steps, Path(d), task)
            print(f"\n{m}: {steps} step(s) of {med['batch']} samples × K={med['K']} ({budget} budget); step median "
                  f"{med['sec_step']:.2f} s wall, {med['cpu_step']:.2f} s CPU; {fwd / 1e6:.1f} MFLOP per row forward, "
                  f"{fb / 1e6:.1f} forward + backward")
            print(f"{'phase':<18} {'wall s':>8} {'CPU s':>8} {'NFE':>7} {'rows':>7} {'GFLOP':>8} "
                  f"{'GFLOP/s':>8} {'% peak':>7}")
            rows = {}
            for ph in [p for p in ORDER if p in phases] + [p for p in phases if p not in ORDER]:
                c = phases[ph]
                gflop = (c['rows'] * fwd + c['grad_rows'] * fb) / 1e9
                rate = gflop / c['wall'] if c['wall'] > 0 else 0.0
                rows[ph] = dict(wall=c['wall'], cpu=c['cpu'], nfe=c['nfe'], rows=c['rows'] + c['grad_rows'],
                                calls=c['calls'], gflop=gflop, gflops=rate, peak_fraction=rate / peak)
                print(f"{ph:<18} {c['wall']:>8.2f} {c['cpu']:>8.2f} {c['nfe']:>7} {c['rows'] + c['grad_rows']:>7} "
                      f"{gflop:>8.1f} {rate:>8.1f} {100 * rate / peak:>6.0f}%")
            result['methods'][m] = dict(phases=rows, flops_per_row=dict(forward=fwd, forward_backward=fb), **med)
    print("\nphases are totals over the steps (calibration and evaluation once); % peak: "
          f"of the {threads}-thread matmul peak")
    if json_out: Path(json_out).write_text(json.dumps(result, indent=1)); print(f"numbers: {json_out}")
