"""What bounds the tiny model's network on this CPU: one transformer forward (the unit of every rollout, value and
evaluation call) timed per rows-per-call, threads and attention kernel, against the machine's fp32 matmul peak
measured in the same run, with a breakdown of a forward's time by kind of operator (torch.profiler).

It also replays the forward's own linear layers alone (same shapes and weights, `F.linear`): their GFLOP/s is
the bound the forward could reach if everything else (GELU, attention, norms, copies) took no time.

Not a test: it prints tables. Rows are transformer rows (a guided sample is 2 rows: conditional and unconditional).
Numbers only mean something on an idle machine. Example (about a minute; `--compile` adds 20 s to 2.5 min: the
regional compilation of the transformer blocks, dynamic in the rows, with a warm or a cold inductor cache):

    .venv/bin/python benchmarks/network.py --rows 64,256,1024 --threads 1,2
"""
import sys
from pathlib import Path
# benchmarks/profile.py would shadow the standard `profile` module (imported by torch._dynamo): keep this folder off the path
sys.path[:] = [p for p in sys.path if Path(p or '.').resolve() != Path(__file__).resolve().parent]

import time
from collections import defaultdict
import torch
from fastcore.script import call_parse
from torch.nn.attention import sdpa_kernel, SDPBackend
from torch.profiler import profile, ProfilerActivity
from torch.utils.flop_counter import FlopCounterMode
from flowgrpo_nb.task import load_policy

KINDS = dict(matmul=('addmm', 'mm', 'bmm', 'matmul', 'linear'), attention=('scaled_dot_product', 'flash_attention'),
             gelu=('gelu',), layer_norm=('layer_norm',), copy=('copy_', 'cat', 'contiguous', 'clone', '_to_copy'),
             elementwise=('add', 'mul', 'silu', 'sub', 'div'), convolution=('convolution',))

def peak(threads:int, n:int=1024, reps:int=15) -> float:
    "Best fp32 GFLOP/s of n³ matmuls on `threads` threads."
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3): a @ b
    best = min(_time(lambda: a @ b) for _ in range(reps))
    return 2 * n ** 3 / best / 1e9

def _time(f) -> float:
    w = time.perf_counter(); f(); return time.perf_counter() - w

def median_time(f, reps:int=9) -> float:
    for _ in range(2): f()
    ts = sorted(_time(f) for _ in range(reps))
    return ts[len(ts) // 2]

def inputs(policy, rows:int):
    x, t = torch.randn(rows, *policy.latent_shape), torch.full((rows,), 500.)
    h, p = policy.module.encode(['a red circle and a blue square'] * rows)
    tr = policy.module.transformer
    return lambda m=tr: m(hidden_states=x, encoder_hidden_states=h, pooled_projections=p, timestep=t, return_dict=False)[0]

def linear_bound(policy, f) -> tuple[float, float]:
    "(seconds, FLOPs) of the forward's linear layers replayed alone with the shapes and weights of one call of `f`."
    calls, hooks = [], []
    for m in policy.module.transformer.modules():
        if isinstance(m, torch.nn.Linear):
            hooks.append(m.register_forward_hook(lambda m, a, o: calls.append((a[0].detach(), m.weight, m.bias))))
    try: f()
    finally:
        for h in hooks: h.remove()
    replay = lambda: [torch.nn.functional.linear(x, w, b) for x, w, b in calls]
    return median_time(replay), sum(2 * x.numel() * w.shape[0] for x, w, b in calls)

def kind_of(name:str) -> str:
    return next((k for k, keys in KINDS.items() if any(s in name for s in keys)), 'other')

def breakdown(f) -> dict:
    "Share of a forward's self CPU time by kind of operator."
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3): f()
    by = defaultdict(float)
    for e in prof.key_averages(): by[kind_of(e.key)] += e.self_cpu_time_total
    tot = sum(by.values())
    return {k: v / tot for k, v in sorted(by.items(), key=lambda kv: -kv[1])}

@call_parse
def main(rows:str='64,256,1024',  # transformer rows per call (comma-separated)
         threads:str='1,2',       # torch threads (comma-separated)
         compile:bool=False):     # also time torch.compile (inductor) at the first rows value, with its compile time
    "Print GFLOP/s of one tiny-transformer forward per rows, threads and attention kernel, and where a forward's time goes."
    rs, ts = [int(r) for r in rows.split(',')], [int(t) for t in threads.split(',')]
    policy = load_policy('tiny'); policy.add_lora(16, 16.0)  # as in training: the adapter's layers run too
    with torch.no_grad(), FlopCounterMode(display=False) as fc: inputs(policy, 1)()
    flop = fc.get_total_flops()
    peaks = {t: peak(t) for t in ts}
    print(f"one row: {flop / 1e6:.1f} MFLOP forward; fp32 matmul peak " + ', '.join(f'{t} thread(s) {p:.0f} GFLOP/s' for t, p in peaks.items()))
    print(f"{'rows':>6} {'threads':>7} {'attention':>10} {'ms':>8} {'GFLOP/s':>8} {'% peak':>7} {'linears alone % peak':>21}")
    with torch.no_grad():
        for t in ts:
            torch.set_num_threads(t)
            for r in rs:
                f = inputs(policy, r)
                ls, lf = linear_bound(policy, f)
                for name, backend in (('default', None), ('math', SDPBackend.MATH)):
                    if backend is None: s = median_time(f)
                    else:
                        with sdpa_kernel(backend): s = median_time(f)
                    g = r * flop / s / 1e9
                    lin = f"{100 * lf / ls / 1e9 / peaks[t]:>20.0f}%" if backend is None else ''
                    print(f"{r:>6} {t:>7} {name:>10} {s * 1e3:>8.1f} {g:>8.1f} {100 * g / peaks[t]:>6.0f}% {lin}")
        torch.set_num_threads(ts[0])
        f = inputs(policy, rs[0])
        print(f"\nwhere a forward of {rs[0]} rows spends its time ({ts[0]} thread(s), self CPU time):")
        for k, v in breakdown(f).items(): print(f"  {k:<12} {100 * v:5.1f}%")
        s, lf = linear_bound(policy, f)
        g = lf / s / 1e9
        print(f"its linear layers alone: {s * 1e3:.1f} ms for {lf / 1e9:.2f} GFLOP ({100 * lf / (rs[0] * flop):.0f}% of the forward's FLOPs) "
              f"= {g:.1f} GFLOP/s, {100 * g / peaks[ts[0]]:.0f}% of the {ts[0]}-thread peak: the most the forward could reach")
        if compile:
            import copy
            tr = copy.deepcopy(policy.module.transformer)
            for b in tr.transformer_blocks: b.compile(dynamic=True)  # regional compilation: each block, any number of rows
            e = median_time(f)
            c = _time(lambda: f(tr))
            s = median_time(lambda: f(tr))
            g = rs[0] * flop / s / 1e9
            print(f"\ntorch.compile of the blocks, {rs[0]} rows, {ts[0]} thread(s): first call {c:.0f} s, then {s * 1e3:.1f} ms vs "
                  f"{e * 1e3:.1f} eager ({e / s:.2f}x; {g:.1f} GFLOP/s, {100 * g / peaks[ts[0]]:.0f}% of peak)")
