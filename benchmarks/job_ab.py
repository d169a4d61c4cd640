"""One comparison job run two ways on identical work, alternating A B A B ... so that a slow spell of the machine (this
VM's speed drifts by up to 1.4x over minutes) falls on both ways.

The ways (`--modes A,B`):
- `now`: the current defaults (single-thread workers, exact zeros skipped, `fast=auto`: the path this machine runs
  faster);
- `eager`: the same, on the eager fp32 path (`--set fast=false`); `fast`: on the bf16 fast path (`--set fast=true`);
- `before`: one process with a torch thread per core, exact-zero advantages evaluated, no gradient diagnostics,
  the eager path: the job as it ran before the worker and skip changes;
- `old`: the code of another checkout (`--old DIR`, e.g. a `git worktree` of an earlier commit), its own defaults.

Not a test: it prints a table of wall and process-CPU seconds per repetition (the CPU of the job's processes, workers
included), the median ratio A / B with its range, and per run each arm's held-out score and share of skipped (sample,
step) pairs. Examples (the default job's arms at one seed, old code against new; the study's arms eager vs fast):

    git worktree add ../old 0cb32da && .venv/bin/python benchmarks/job_ab.py --modes old,now --old ../old \\
        --arms flow_grpo,flow_grpo_first4,dense --steps 24 --prompts 2 --reps 2
    .venv/bin/python benchmarks/job_ab.py --modes eager,now --arms flow_grpo,stepwise,dense,flow_grpo_nfe \\
        --steps 12 --reps 2
"""
import json, os, resource, statistics, subprocess, sys, tempfile, time
from pathlib import Path
from fastcore.script import call_parse

from flowgrpo_nb.study.design import ARMS
from flowgrpo_nb.study.compare import usable_cores
from flowgrpo_nb.config import GRPOConfig

# optimizer steps per rollout batch: each takes a whole minibatch of its share
UPDATES = GRPOConfig().updates_per_rollout

MODES = {'before': ['--workers', '1', '--threads', '{threads}', '--set', 'skip_zero_adv=False', 'diag_every=0',
                    'fast=false'],
         'eager': ['--set', 'fast=false'], 'fast': ['--set', 'fast=true'], 'now': ['--set'], 'old': ['--set']}

def run_job(mode:str, out:Path, arms:list, task:str, steps:int, batch:tuple, budget:str='quick',
            old:str|None=None, threads:int|None=None) -> dict:
    """Wall and CPU seconds (this job's processes) of one `flowgrpo compare` run; per arm its held-out score and skipped
    share. `threads`: the torch threads of mode `before` (default: one per usable core)."""
    p, g = batch
    args = [a.format(threads=threads or usable_cores()) for a in MODES[mode]] + [
        f'steps={steps}', f'eval_every={steps}', f'prompts_per_step={p}', f'group_size={g}',
        f'minibatch={p * g // UPDATES}']
    cmd = [sys.executable, '-m', 'flowgrpo_nb.cli', 'compare', '--out', str(out), '--budget', budget, '--seeds', '0',
           '--tasks', task, '--arms', *arms, '--no-png', *args]
    env = {**os.environ, 'PYTHONPATH': old} if mode == 'old' else None
    r0, w = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=old if mode == 'old' else None)
    wall, r1 = time.perf_counter() - w, resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode:
        raise SystemExit(f"{mode} run failed (rc {res.returncode}): {res.stderr.strip().splitlines()[-1]}")
    got = json.loads((out/'report.json').read_text())['tasks'][task]['arms']
    return dict(wall=wall, cpu=(r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
                score={a: got[a]['heldout_strict']['mean'] for a in arms},
                skipped={a: (got[a]['skipped'] or {}).get('mean', 0.0) for a in arms})

@call_parse
def main(
    # comma-separated arms of the job (flowgrpo_nb.study.design.ARMS)
    arms:str='flow_grpo,stepwise,dense,turning_point',
    modes:str='before,now',  # the two ways, A,B: before, eager, fast, now, old
    old:str=None,        # with mode old: the folder of the other checkout (its flowgrpo_nb runs)
    task:str='geneval',  # the comparison task
    steps:int=8,         # training steps per run
    prompts:int=4,       # prompts per step
    group:int=8,         # samples per prompt
    reps:int=2,          # repetitions of each way, alternating
    budget:str='quick',  # the comparison budget the runs start from (smoke: a quick check that this script works)
    threads:int=None):   # torch threads of mode before (default: one per usable core; 1: a quick check)
    "Print wall and CPU seconds of the same comparison job run two ways, alternating, and their median ratio."
    arms, ways = [a.strip() for a in arms.split(',') if a.strip()], [m.strip() for m in modes.split(',')]
    bad = [a for a in arms if a not in ARMS]
    if bad or not arms:
        raise SystemExit(f"arms={','.join(arms)!r}: allowed a comma-separated subset of {', '.join(ARMS)}")
    if len(ways) != 2 or any(m not in MODES for m in ways):
        raise SystemExit(f"modes={modes!r}: allowed two of {', '.join(MODES)}, comma-separated")
    if 'old' in ways and not (old and (Path(old)/'flowgrpo_nb').is_dir()):
        raise SystemExit(f"old={old!r}: mode old needs --old DIR holding flowgrpo_nb/")
    if reps < 1 or steps < 1 or (threads is not None and threads < 1):
        raise SystemExit(f"reps={reps}, steps={steps}, threads={threads}: each must be at least 1")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(reps):
            for mode in ways:
                r = run_job(mode, Path(d)/f'{mode}{i}', arms, task, steps, (prompts, group), budget, old, threads)
                rows.append(dict(rep=i, mode=mode, **r))
                print(f"rep {i} {mode:<7} wall {r['wall']:7.1f} s  CPU {r['cpu']:7.1f} s  held-out (skipped) " +
                      ' '.join(f"{a} {r['score'][a]:.3f} ({r['skipped'][a]:.0%})" for a in arms), flush=True)
    for k in ('wall', 'cpu'):
        rs = [a[k] / b[k] for a, b in zip(rows[0::2], rows[1::2])]
        print(f"{k}: {ways[0]} / {ways[1]} = {statistics.median(rs):.2f}x (range {min(rs):.2f}-{max(rs):.2f} "
              f"over {len(rs)} pair(s))")
