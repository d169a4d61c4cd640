"""Wall time of a grouped rollout vs the lookahead of each step-value operator (medians of several runs).

Not a test: it prints a table. Example (CPU, the shipped tiny model if present, else a random one of its size):

    .venv/bin/python benchmarks/rollout_vs_lookahead.py --prompts 4 --group 4 --steps 10 --reps 5 --threads 1
"""
import statistics, time
from pathlib import Path

import torch
from fastcore.script import call_parse

from flowgrpo_nb.rollout import RolloutConfig, rollout, step_values
from flowgrpo_nb.tiny import ASSETS, TinyFlowModel, TinyPolicy, count_params, load_tiny
from flowgrpo_nb.world import MiniGenEvalReward, prompt_split


def _model(path):
    if path == 'random' or (path is None and not (ASSETS / 'tiny.safetensors').exists()):
        torch.manual_seed(0)
        return TinyFlowModel().eval(), 'random tiny'
    return load_tiny(path), f"tiny from {path or ASSETS / 'tiny.safetensors'}"


def _timed(f):
    t0 = time.perf_counter(); out = f(); return out, time.perf_counter() - t0


@call_parse
def main(prompts:int=4,           # P: prompts per batch
         group:int=4,             # G: samples per prompt
         steps:int=10,            # K: sampling steps
         reps:int=5,              # timed runs (after one warm-up)
         ops:str='tweedie,ode:5,ode:rest',  # lookahead operators, comma-separated
         guidance:float=4.0,      # CFG scale
         shared_noise:bool=False, # one initial noise per group
         model:str=None,          # checkpoint .safetensors; 'random': random weights; default: shipped model if any
         threads:int=1,           # torch CPU threads
         device:str='cpu',
         max_batch:int=1024):     # samples per network call
    "Print median wall seconds of `rollout` and of `step_values` per operator, with NFE per trajectory."
    P, G, K = prompts, group, steps
    torch.set_num_threads(threads)
    net, name = _model(model)
    policy = TinyPolicy(net.to(device))
    cfg = RolloutConfig(K=K, group_size=G, guidance=guidance, shared_noise=shared_noise, max_batch=max_batch)
    reward, prompts = MiniGenEvalReward('partial'), prompt_split('train')[:P]
    ops = [o.strip() for o in ops.split(',') if o.strip()]
    times = {k: [] for k in ['rollout'] + ops}
    info = {}
    for r in range(reps + 1):  # run 0 warms up
        g = torch.Generator(device).manual_seed(r)
        ro, dt = _timed(lambda: rollout(policy, prompts, cfg, reward, g))
        if r: times['rollout'].append(dt)
        info['rollout'] = (float(K), K)
        for op in ops:
            sv, dt = _timed(lambda: step_values(policy, ro, op, reward))
            if r: times[op].append(dt)
            info[op] = (sv.nfe_per_sample, sv.calls)
    B = P * G
    print(f"rollout vs lookahead: B={B} ({P} prompts x {G}), K={K}, guidance {guidance}, {name} "
          f"({count_params(net) / 1e6:.1f}M params), {device}, {threads} thread(s), median of {reps} runs")
    base = statistics.median(times['rollout'])
    print(f"{'phase':<10} {'NFE/traj':>9} {'calls':>6} {'median s':>9} {'min s':>8} {'ms/NFE':>7} {'x rollout':>10}")
    for k, ts in times.items():
        nfe, calls = info[k]
        med = statistics.median(ts)
        per = 1000 * med / (nfe * B) if nfe else float('nan')
        print(f"{k:<10} {nfe:>9g} {calls:>6} {med:>9.3f} {min(ts):>8.3f} {per:>7.2f} {med / base:>10.2f}")
