"""The speed changes of the comparison job measured on identical work, side by side: the same `flowgrpo compare` job
run the way it ran before them (one process with a torch thread per core, exact-zero advantages evaluated, no gradient
diagnostics) and the way it runs now (single-thread worker processes, exact zeros skipped), alternating A B A B ...
so that a slow spell of the machine (this VM's speed drifts by up to 1.4x over minutes) falls on both.

Not a test: it prints a table of wall and process-CPU seconds per repetition (the CPU of the job's processes, workers
included), the median ratio before / now with its range, and per run each arm's held-out score and share of skipped
(sample, step) pairs (0 before). The skip and the thread count change float summation order only, so the scores agree
unless training amplifies the rounding. Example (4 arms x 8 steps x 4 prompts x 8 samples, ~8 min):

    .venv/bin/python benchmarks/job_ab.py --arms flow_grpo,stepwise,dense,turning_point --steps 8 --reps 2
"""
import json, os, resource, statistics, subprocess, sys, tempfile, time
from pathlib import Path
from fastcore.script import call_parse

from flowgrpo_nb.design import ARMS
from flowgrpo_nb.compare import usable_cores

# before: one process on every usable core's thread, zeros evaluated, no diagnostics; now: the defaults (one single-thread
# worker per usable core, at most one per job; zeros skipped; gradient shares every 8 steps, timed apart)
MODES = {'before': ['--workers', '1', '--threads', str(usable_cores()), '--set', 'skip_zero_adv=False', 'diag_every=0'],
         'now': ['--set']}

def run_job(mode:str, out:Path, arms:list, task:str, steps:int, batch:tuple, budget:str='default') -> dict:
    "Wall and CPU seconds (this job's processes) of one `flowgrpo compare` run; per arm its held-out score and skipped share."
    p, g = batch
    args = MODES[mode] + [f'steps={steps}', f'eval_every={steps}', f'prompts_per_step={p}', f'group_size={g}', f'minibatch={p * g}']
    cmd = [sys.executable, '-m', 'flowgrpo_nb.cli', 'compare', '--out', str(out), '--budget', budget, '--seeds', '0', '--tasks', task,
           '--arms', *arms, '--no-png', *args]
    r0, w = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    wall, r1 = time.perf_counter() - w, resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode: raise SystemExit(f"{mode} run failed (rc {res.returncode}): {res.stderr.strip().splitlines()[-1]}")
    rep = json.loads((out/'report.json').read_text())
    got = rep['tasks'][task]['arms']
    return dict(wall=wall, cpu=(r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
                score={a: got[a]['heldout_strict']['mean'] for a in arms}, skipped={a: got[a]['skipped']['mean'] for a in arms})

@call_parse
def main(arms:str='flow_grpo,stepwise,dense,turning_point',  # comma-separated arms of the job (flowgrpo_nb.design.ARMS)
         task:str='geneval',  # the comparison task
         steps:int=8,         # training steps per run
         prompts:int=4,       # prompts per step
         group:int=8,         # samples per prompt
         reps:int=2,          # repetitions of each mode, alternating
         budget:str='default'):  # the comparison budget the runs start from (smoke: a quick check that this script works)
    "Print wall and CPU seconds of the same comparison job run the old way and the current way, alternating."
    arms = [a.strip() for a in arms.split(',') if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms: raise SystemExit(f"arms={','.join(arms)!r}: allowed a comma-separated subset of {', '.join(ARMS)}")
    if reps < 1 or steps < 1: raise SystemExit(f"reps={reps}, steps={steps}: each must be at least 1")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(reps):
            for mode in MODES:
                r = run_job(mode, Path(d)/f'{mode}{i}', arms, task, steps, (prompts, group), budget)
                rows.append(dict(rep=i, mode=mode, **r))
                print(f"rep {i} {mode:<7} wall {r['wall']:7.1f} s  CPU {r['cpu']:7.1f} s  held-out (skipped) " +
                      ' '.join(f"{a} {r['score'][a]:.3f} ({r['skipped'][a]:.0%})" for a in arms), flush=True)
    for k in ('wall', 'cpu'):
        rs = [b[k] / n[k] for b, n in zip(rows[0::2], rows[1::2])]
        print(f"{k}: before / now = {statistics.median(rs):.2f}x (range {min(rs):.2f}-{max(rs):.2f} over {len(rs)} pair(s))")
