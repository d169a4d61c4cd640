"""Fit the cost model's `UNIT_ROWS` (nbs/06b_design.ipynb) from a finished comparison's own runs.

`estimate_cost` prices every phase in units (a rollout's sample and network evaluation, a lookahead's sample and
network evaluation, an update's (sample, trained step) pair that is not skipped, an evaluation's image and step), and a
unit as a number of the precision probe's rows (`flowgrpo_nb.precision.time_paths`) times the probe's CPU seconds per
row on the machine that runs the job. This script reads every training step and evaluation that the runs of a
comparison folder logged (`metrics.jsonl`: process CPU seconds per phase, NFE, the share of skipped pairs), takes each
phase's median CPU seconds per unit, and divides it by the probe's seconds per row on this machine, for the path the
runs took (their config.json). Run it on the machine that ran the comparison, idle (`--refresh` times the probe anew).

Not a test: it prints a table (phase, units counted, median CPU ms per unit with its quartiles, probe ms per row, the
fitted rows per unit, and the rows per unit the package uses now). Example (seconds):

    .venv/bin/python benchmarks/unit_rows.py runs/compare --refresh

With `--json FILE` it also writes what the table of machines in nbs/running.ipynb (Speed) reads: this machine's
CPU, the path `fast='auto'` takes here and why, the probe's milliseconds per row, the fit, and the comparison's
measured CPU and wall seconds (its report.json) beside what `estimate_cost` predicts for the same job with the
package's units.
"""
import json, statistics
from pathlib import Path
from fastcore.script import call_parse

from flowgrpo_nb.config import run_config
from flowgrpo_nb.checkpoint import RunFolder
from flowgrpo_nb.precision import machine_paths, path_name
from flowgrpo_nb.study.design import CompareConfig
from flowgrpo_nb.study.costs import UNIT_ROWS, path_seconds, job_costs, estimate_cost

def units(run:Path) -> dict:
    "{phase: [CPU seconds per unit, one per logged step or evaluation]} of one run folder."
    cfg = run_config(run)
    s, e = cfg.rollout_config().window
    B, out = cfg.batch_size, {k: [] for k in UNIT_ROWS}
    for m in RunFolder(run).metrics():
        if 'cpu_rollout' in m: out['rollout'].append(m['cpu_rollout'] / (B * m['nfe_rollout']))
        if m.get('nfe_lookahead'): out['lookahead'].append(m['cpu_values'] / (B * m['nfe_lookahead']))
        if 'cpu_update' in m and m.get('skipped', 0) < 1:
            out['update'].append(m['cpu_update'] / (B * (e - s) * (1 - m.get('skipped', 0))))
        if 'cpu_eval' in m and cfg.eval_images: out['evaluation'].append(m['cpu_eval'] / (cfg.eval_images * cfg.K))
    return out

def job_record(folder:Path, timings:dict) -> dict|None:
    """The comparison's measured CPU and wall seconds (report.json) beside `estimate_cost`'s for the same job on
    `timings`' machine."""
    rep, cc = folder/'report.json', folder/'compare.json'
    if not (rep.is_file() and cc.is_file()): return None
    tm, c = json.loads(rep.read_text()).get('timing') or {}, json.loads(cc.read_text())
    ccfg = CompareConfig(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in c.items()})
    est = estimate_cost(ccfg, tm.get('workers', 2), timings)
    return dict(command=tm.get('command'), workers=tm.get('workers'), runs=tm.get('runs'),
                estimated_cpu_seconds=sum(job_costs(ccfg, timings=timings).values()),
                measured_cpu_seconds=tm['cpu_seconds']['total'], estimated_wall_seconds=est['wall_seconds'],
                wall_seconds=json.loads(rep.read_text()).get('wall_seconds'))

@call_parse
def main(folder:str,             # a comparison folder (flowgrpo compare --out) whose runs finished on this machine
         refresh:bool=False,     # time the precision probe anew (on an idle machine) instead of reading its cache
         # also write this machine's record (the table of machines in nbs/running.ipynb) to this file
         json_out:str=None):
    runs = sorted(p.parent for p in Path(folder).rglob('config.json') if (p.parent/'metrics.jsonl').exists())
    if not runs: raise SystemExit(f"folder={folder!r}: no run folders (config.json with metrics.jsonl) under it")
    paths = {run_config(r).fast for r in runs}
    if len(paths) > 1:
        raise SystemExit(f"folder={folder!r}: its runs took both precision paths; fit one path at a time")
    fast = paths.pop()
    m = machine_paths(refresh=refresh)
    per_row = path_seconds(m['timings'], fast)
    pooled = {k: [] for k in UNIT_ROWS}
    for r in runs:
        for k, v in units(r).items(): pooled[k] += v
    print(f"{len(runs)} runs on the {path_name(fast)} path; probe on {m['key']['cpu']} ({m['key']['capability']}, "
          f"torch {m['key']['torch']}), measured {m['measured']}")
    print(f"{'phase':<11} {'units':>6} {'ms/unit (q1-q3)':>22} {'probe ms/row':>13} {'rows/unit':>10} {'now':>6}")
    fit = {}
    for k, (kind, now) in UNIT_ROWS.items():
        v = sorted(pooled[k])
        if not v: print(f"{k:<11} {0:>6} {'—':>22}"); continue
        q1, med, q3 = (statistics.quantiles(v, n=4) if len(v) > 1 else (v[0],) * 3)
        fit[k] = med / per_row[kind]
        print(f"{k:<11} {len(v):>6} {1e3 * med:>9.2f} ({1e3 * q1:.2f}-{1e3 * q3:.2f}) {1e3 * per_row[kind]:>13.3f} "
              f"{fit[k]:>10.2f} {now:>6.2f}")
    print('UNIT_ROWS = dict(' + ', '.join(f"{k}=({UNIT_ROWS[k][0]!r}, {v:.2f})" for k, v in fit.items()) + ')')
    job = job_record(Path(folder), m['timings'])
    if job: print(f"the job: estimated {job['estimated_cpu_seconds']:.0f} CPU s ({job['estimated_wall_seconds']:.0f} s "
                  f"wall), measured {job['measured_cpu_seconds']:.0f} CPU s ({job['wall_seconds']:.0f} s wall): "
                  f"estimate / measured = {job['estimated_cpu_seconds'] / job['measured_cpu_seconds']:.2f}")
    if json_out:
        ms = {p: {k: (None if v is None else round(1e3 * v, 4)) for k, v in m['timings'][p].items()}
              for p in ('fp32', 'bf16')}
        rec = dict(machine=m['key'], path=path_name(m['fast']), why=m['why'], measured=m['measured'],
                   probe_ms_per_row=ms, runs_path=path_name(fast), unit_rows={k: round(v, 3) for k, v in fit.items()},
                   job=job)
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(json.dumps(rec, indent=1) + '\n')
        print(f"wrote {json_out}")
