"""The tiny model's network, eager against its fast path (`TinyPolicy.set_fast`, nbs/02_tiny.ipynb), side by side.

Every rollout, step value, evaluation and update is calls of one transformer; this script times those calls the way
the trainer makes them (`TinyPolicy._velocity`, adapter attached) at the sizes a comparison uses: forwards without
gradient at the rollout's 32 rows (2 prompts x 8 samples, guided: two rows per sample), the lookahead's 288 rows and
the evaluation's 512, and forward + backward at the update's 288 rows (16 samples x 9 steps x 2). Eager and fast
calls alternate (eager, fast, eager, fast, ...) so that a slow spell of the machine falls on both; each cell is the
median of the calls' process CPU seconds with their spread (min-max), in rows per CPU second and in GFLOP/s against
the fp32 and bf16 matmul peaks measured in the same run (1024^3 products, best of several; a dtype without native
kernels: its rate at 256^3). The speed-up is the
median of the paired (eager / fast) ratios.

It also shows where a fast forward's time goes by kind of operator (torch.profiler), and the eager forward's linear
layers replayed alone (same shapes and weights): what the eager forward could reach if nothing but its matrix
products took time.

Not a test: it prints tables, and numbers only mean something on an idle machine. Example (about 3 minutes):

    .venv/bin/python benchmarks/network.py --threads 1,2
"""
import statistics, time
from collections import defaultdict
import torch
from fastcore.script import call_parse
from torch.profiler import profile, ProfilerActivity
from torch.utils.flop_counter import FlopCounterMode
from flowgrpo_nb.precision import path_pair, probe_policy

KINDS = dict(matmul=('addmm', 'mm', 'bmm', 'matmul', 'linear'),
             attention=('scaled_dot_product', 'flash_attention', 'softmax'),
             gelu=('gelu', 'sigmoid'), layer_norm=('layer_norm',),
             copy=('copy_', 'cat', 'contiguous', 'clone', '_to_copy'),
             elementwise=('add', 'mul', 'silu', 'sub', 'div'), convolution=('convolution',))

def peak(dtype, n:int=1024, reps:int=9, budget:float=0.5) -> float:
    """Best GFLOP/s of n^3 matmuls in `dtype` on the current threads. A trial at n / 4 first: where its rate would
    make one n^3 call cost over `budget` CPU seconds (no native kernels: bf16 on an AVX2 CPU, about 2.4 s a call), the
    trial's rate is the answer and the 12 full calls are not made."""
    m = n // 4
    x, y = torch.randn(m, m, dtype=dtype), torch.randn(m, m, dtype=dtype)
    x @ y  # warm-up: oneDNN builds its kernels on the first call
    trial = 2 * m ** 3 / _cpu(lambda: x @ y)
    if 2 * n ** 3 / trial > budget: return trial / 1e9
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3): a @ b
    return max(2 * n ** 3 / _cpu(lambda: a @ b) for _ in range(reps)) / 1e9

def _cpu(f) -> float:
    c = time.process_time(); f(); return time.process_time() - c

def policies():
    "(eager, fast) policies with the same adapter (moved off zero, as after training)."
    return path_pair(probe_policy())

def call(policy, rows:int, grad:bool):
    "One network call of `rows` rows the way the trainer makes it (with gradient: then a backward)."
    x, t = torch.randn(rows, *policy.latent_shape), torch.rand(rows)
    c = policy.encode(['a red circle and a blue square'] * rows)
    def f():
        with torch.set_grad_enabled(grad):
            v = policy._velocity(x, t, c.embeds, c.pooled)
            if grad: v.square().mean().backward()
    return f

def flops(policy, rows:int, grad:bool) -> float:
    with FlopCounterMode(display=False) as fc: call(policy, rows, grad)()
    return fc.get_total_flops()

def alternate(eager, fast, reps:int) -> tuple[list, list]:
    "Process CPU seconds of `reps` eager and fast calls, alternating, after two warm-up calls of each."
    for _ in range(2): eager(); fast()
    es, fs = [], []
    for _ in range(reps): es.append(_cpu(eager)); fs.append(_cpu(fast))
    return es, fs

def linear_bound(policy, rows:int) -> tuple[float, float]:
    "(seconds, FLOPs) of the eager forward's linear layers replayed alone with the shapes and weights of one call."
    calls, hooks = [], []
    for m in policy.transformer.modules():
        if isinstance(m, torch.nn.Linear):
            hooks.append(m.register_forward_hook(lambda m, a, o: calls.append((a[0].detach(), m.weight, m.bias))))
    try:
        with torch.no_grad(): call(policy, rows, False)()
    finally:
        for h in hooks: h.remove()
    replay = lambda: [torch.nn.functional.linear(x, w, b) for x, w, b in calls]
    return statistics.median(_cpu(replay) for _ in range(7)), sum(2 * x.numel() * w.shape[0] for x, w, b in calls)

def breakdown(f) -> dict:
    "Share of a call's self CPU time by kind of operator."
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3): f()
    by = defaultdict(float)
    for e in prof.key_averages():
        by[next((k for k, keys in KINDS.items() if any(s in e.key for s in keys)), 'other')] += e.self_cpu_time_total
    tot = sum(by.values())
    return {k: v / tot for k, v in sorted(by.items(), key=lambda kv: -kv[1])}

@call_parse
def main(threads:str='1,2',          # torch threads (comma-separated)
         forward:str='32,288,512',   # rows of the forwards without gradient: rollout, lookahead, evaluation
         update:str='288',           # rows of the forward + backward calls (the update's minibatch)
         reps:int=9):                # timed calls of each path per cell
    "Print eager vs fast CPU time per network call at the comparison's sizes, against the matmul peaks of the same run."
    eager, fast = policies()
    sizes = [(int(r), False) for r in forward.split(',')] + [(int(r), True) for r in update.split(',')]
    fl = {(r, g): flops(eager, r, g) for r, g in sizes}
    print(f"one row: {fl[sizes[0]] / sizes[0][0] / 1e6:.1f} MFLOP forward" +
          (f", {fl[sizes[-1]] / sizes[-1][0] / 1e6:.1f} MFLOP forward + backward" if sizes[-1][1] else ''))
    head = (f"{'threads':>7} {'rows':>5} {'pass':>10} {'path':>6} {'ms (min-max)':>22} {'rows/CPU s':>10} "
            f"{'GFLOP/s':>8} {'% peak':>7} {'speed-up':>9}")
    for th in [int(t) for t in threads.split(',')]:
        torch.set_num_threads(th)
        pk = {torch.float32: peak(torch.float32), torch.bfloat16: peak(torch.bfloat16)}
        print(f"\n{th} thread(s): matmul peak fp32 {pk[torch.float32]:.0f} GFLOP/s, "
              f"bf16 {pk[torch.bfloat16]:.0f} GFLOP/s\n{head}")
        for rows, grad in sizes:
            es, fs = alternate(call(eager, rows, grad), call(fast, rows, grad), reps)
            ratio = statistics.median(e / f for e, f in zip(es, fs))
            for name, ts, p in (('eager', es, pk[torch.float32]), ('fast', fs, pk[torch.bfloat16])):
                m = statistics.median(ts)
                g = fl[(rows, grad)] / m / 1e9
                spread = f"{1e3 * m:.1f} ({1e3 * min(ts):.1f}-{1e3 * max(ts):.1f})"
                print(f"{th:>7} {rows:>5} {'fwd+bwd' if grad else 'forward':>10} {name:>6} {spread:>22} "
                      f"{rows / m:>10.0f} {g:>8.1f} {100 * g / p:>6.0f}% "
                      f"{f'{ratio:.2f}x' if name == 'fast' else '':>9}")
        if th == int(threads.split(',')[0]):
            r0 = sizes[0][0]
            print(f"\nwhere a fast forward of {r0} rows spends its time ({th} thread(s), self CPU time):")
            for k, v in breakdown(call(fast, r0, False)).items(): print(f"  {k:<12} {100 * v:5.1f}%")
            s, lf = linear_bound(eager, r0)
            g = lf / s / 1e9
            print(f"the eager forward's linear layers alone: {s * 1e3:.1f} ms for {lf / 1e9:.2f} GFLOP "
                  f"({100 * lf / fl[sizes[0]]:.0f}% of the forward's FLOPs) = {g:.1f} GFLOP/s, "
                  f"{100 * g / pk[torch.float32]:.0f}% of the fp32 peak: the most the eager forward could reach")
