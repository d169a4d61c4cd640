"""Plan and write the second confirmatory study's pre-registration (`design/credit_prereg.toml`): is it the credit?

Why (issue 50). The confirmatory study (results/confirm) decided that DenseGRPO and TP-GRPO end higher than Flow-GRPO at
equal optimizer steps; read at equal CPU seconds or NFE the edge shrinks to +0.02 or nothing, and the only
window-matched data (the exploratory study) says Flow-GRPO trained on the early steps does as well. This study sets
dense credit against the window it trains and the compute it spends, on fresh seeds, each question with a superiority
and an equivalence verdict (one row: `holds` above 0, `equivalent` within +-margin, `does not hold` when an effect as
large as the margin is excluded). Everything that depends on data is read from files the package wrote, never typed in:

- **equal CPU, fixed by step counts**: Flow-GRPO trains until its CPU seconds match DenseGRPO's 100 steps (calibration
  included), rounded to the nearest evaluation (every 25 steps), so that noisy timings do not enter the test. On the
  few-level reward the ratio is the confirmatory study's own (its 14 seeds of each arm, results/confirm/report.json); on
  the continuous reward, which no run of this recipe has trained, a short timing run of each arm
  (`measure`, written to results/credit_pilot/cost.json with the machine's CPU);
- **planning SDs**: the paired SDs the confirmatory study measured (results/confirm: D1, DenseGRPO - Flow-GRPO on the
  mean of the last two evaluations at equal steps; D1@cpu, the same at equal CPU seconds), the larger of the two for
  every few-level claim (none of this recipe's runs trained `flow_grpo_train4`, said in `sd_from`);
- **seeds**: the most any primary claim asks for its superiority test or its equivalence test at Holm's level alpha / m
  and power 0.8 (`stats.seeds_for`), numbered from 5000 (geneval) and 6000 (score): never run before (exploratory 0-7,
  quick job 0-4, pilot 1000-1007, confirmatory 2000-2013, the timing runs 4000);
- **the budget** (16 CPU-hours, estimated with `run_cost` on this machine): the primary claims' seeds first; the
  continuous-reward claims are secondary (no run of this recipe on that task exists to plan an SD from) and take the
  seeds that still fit, at least SECONDARY_SEEDS.

    .venv/bin/python benchmarks/credit_prereg.py measure [--from DIR]   # the score task's timing runs (or read DIR's)
    .venv/bin/python benchmarks/credit_prereg.py plan                   # prints the plan
    .venv/bin/python benchmarks/credit_prereg.py plan --write  # writes design/credit_prereg.toml (never overwrites)
"""
import argparse, json, os, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from flowgrpo_nb.precision import cpu_name
DEST = ROOT/'design'/'credit_prereg.toml'
COST = ROOT/'results'/'credit_pilot'/'cost.json'
FIRST_SEED = dict(geneval=5000, score=6000)
MARGIN = dict(geneval=0.03, score=0.02)  # held-out strict score / learned score (why: the file's header)
CPU_HOURS = 16.0
SECONDARY_SEEDS = 6
H, EVERY = 100, 25
PILOT = dict(reward='score', steps=10, eval_images=0, fast=False, log_with='none', prompts_per_step=4, group_size=8,
             minibatch=16, calib_iters=4, calib_samples=16, seed=4000, save_every=0)

def claims(steps:dict) -> list[dict]:
    "The questions, in the file's order; `steps`: {task: Flow-GRPO's steps at DenseGRPO's CPU seconds}."
    g, s = steps['geneval'], steps['score']
    row = lambda **kw: dict(claim='level', metric='last_mean', k=2, test='superiority', family='primary') | kw
    return [
        row(id='C1', question='Is it the credit? Does DenseGRPO end higher than Flow-GRPO trained on the same early '
                              'steps (flow_grpo_train4, steps 0-3) at equal optimizer steps?',
            arm='dense', other='flow_grpo_train4', task='geneval', other_steps=H),
        row(id='C2', question=f'At equal CPU seconds, does DenseGRPO (100 steps) end higher than Flow-GRPO trained '
                              f'until it has spent as much ({g} steps)?',
            arm='dense', other='flow_grpo', task='geneval', other_steps=g),
        row(id='C3', question='Is it the window? Does Flow-GRPO trained on steps 0-3 only end higher than Flow-GRPO on '
                              'every step, at equal optimizer steps?',
            arm='flow_grpo_train4', other='flow_grpo', task='geneval', other_steps=H),
        row(id='C4', question='Under a continuous reward (the learned score), does DenseGRPO end higher than Flow-GRPO '
                              'at equal optimizer steps?',
            arm='dense', other='flow_grpo', task='score', score='learned', other_steps=H, family='secondary'),
        row(id='C5', question=f'Under the continuous reward, does DenseGRPO (100 steps) end higher than Flow-GRPO at '
                              f'equal CPU seconds ({s} steps)?',
            arm='dense', other='flow_grpo', task='score', score='learned', other_steps=s, family='secondary'),
    ]

def to_step(x:float) -> int: return max(EVERY, int(round(x / EVERY)) * EVERY)

def measure(src:str|None) -> dict:
    """CPU seconds per step of Flow-GRPO and DenseGRPO on the score task (runs in `src`, or trained now), written to
    COST."""
    import numpy as np, torch
    if src is None:
        src = tempfile.mkdtemp()
        for a in ('flow_grpo', 'dense'):
            sets = [f'{k}={str(v).lower() if isinstance(v, bool) else v}' for k, v in PILOT.items()]
            subprocess.run([sys.executable, '-m', 'flowgrpo_nb.cli', 'train', '--preset', a, '--out', f'{src}/{a}',
                            '--quiet', '--set', *sets], check=True, env={**os.environ, 'OMP_NUM_THREADS': '1'})
    out = {}
    for a in ('flow_grpo', 'dense'):
        rows = [json.loads(l) for l in (Path(src)/a/'metrics.jsonl').read_text().splitlines() if l.strip()]
        steps = [r for r in rows if 'cpu_step' in r]
        cal = json.loads((Path(src)/a/'calibration.json').read_text())['cost']['cpu_seconds'] if a == 'dense' else 0.0
        out[a] = dict(cpu_per_step=float(np.median([r['cpu_step'] for r in steps])), steps=len(steps), calibration=cal)
    rec = dict(runs=out, settings=PILOT, cpu=cpu_name(),
               capability=torch.backends.cpu.get_cpu_capability(), torch=torch.__version__)
    COST.parent.mkdir(parents=True, exist_ok=True)
    COST.write_text(json.dumps(rec, indent=1) + '\n')
    return rec

def equal_cpu_steps() -> tuple[dict, dict]:
    "{task: Flow-GRPO's steps at DenseGRPO's CPU seconds of H steps} and how each was measured."
    conf = json.loads((ROOT/'results'/'confirm'/'report.json').read_text())['tasks']['geneval']['per_seed'].values()
    dense = sum(r['dense']['total_cpu_seconds'] for r in conf) / len(conf)  # its H steps and calibration
    flow = sum(r['flow_grpo']['total_cpu_seconds'] / r['flow_grpo']['steps'] for r in conf) / len(conf)
    c = json.loads(COST.read_text())['runs']
    score = (H * c['dense']['cpu_per_step'] + c['dense']['calibration']) / c['flow_grpo']['cpu_per_step']
    how = dict(geneval=f"DenseGRPO's {dense:.0f} CPU s over {H} steps / Flow-GRPO's {flow:.2f} per step = "
                       f"{dense / flow:.0f} steps (results/confirm, 14 seeds each)",
               score=f"DenseGRPO's {c['dense']['cpu_per_step']:.2f} CPU s per step x {H} + its calibration "
                     f"{c['dense']['calibration']:.0f} s / Flow-GRPO's {c['flow_grpo']['cpu_per_step']:.2f} "
                     f"= {score:.0f} steps (results/credit_pilot/cost.json)")
    return dict(geneval=to_step(dense / flow), score=to_step(score)), how

def planning_sd() -> tuple[float, str]:
    "The few-level claims' planning SD: the larger of the confirmatory study's paired SDs of D1 and D1@cpu."
    cs = {c['id']: c for c in json.loads((ROOT/'results'/'confirm'/'report.json').read_text())['contrasts']}
    sd = max(cs['D1']['sd'], cs['D1@cpu']['sd'])
    return round(sd, 4), (f"the larger of the confirmatory study's paired SDs (results/confirm, 14 seeds): D1 "
                          f"{cs['D1']['sd']:.4f} (last_mean2 at equal steps), D1@cpu {cs['D1@cpu']['sd']:.4f} (at "
                          "equal CPU seconds); no run of this recipe trained flow_grpo_train4")

def plan() -> dict:
    from flowgrpo_nb.study.design import Claim, Prereg, CompareConfig, BUDGETS, budget_fields, arm_config, TASKS
    from flowgrpo_nb.study.costs import run_cost
    from flowgrpo_nb.study.design import prereg_seeds, prereg_steps
    from flowgrpo_nb.study.stats import seeds_for, holm_level
    steps, how = equal_cpu_steps()
    sd, sd_from = planning_sd()
    rows = [Claim(**(r | dict(margin=MARGIN[r['task']], sd=sd if r['task'] == 'geneval' else None,
                             sd_from=sd_from if r['task'] == 'geneval' else None,
                             note=None if r['family'] == 'primary' else
                             'secondary: no run of this recipe on the score task exists to plan an SD from')))
            for r in claims(steps)]
    prim = [c for c in rows if c.family == 'primary']
    level = holm_level(0.05, len(prim))
    need = {c.id: max(seeds_for('superiority', c.sd, c.margin, level, 0.8),
                      seeds_for('equivalence', c.sd, c.margin, level, 0.8))
            for c in prim}
    pre = Prereg('plan', 0.05, 0.8, rows, ())
    b = BUDGETS['credit'] | dict(steps_of=prereg_steps(pre))
    arms = {t: list(dict.fromkeys(['flow_grpo'] + [a for c in rows if c.task == t for a in (c.arm, c.other)]))
            for t in TASKS}
    per_seed = {t: sum(sum(run_cost(arm_config(a, **budget_fields(b, FIRST_SEED[t], t, a)),
                                    TASKS[t]['levels']).values())
                       for a in arms[t]) for t in TASKS}
    n_g = max(need.values())
    left = CPU_HOURS * 3600 - n_g * per_seed['geneval']
    n_s = max(SECONDARY_SEEDS, int(left // per_seed['score']))
    seeds = dict(geneval=list(range(FIRST_SEED['geneval'], FIRST_SEED['geneval'] + n_g)),
                 score=list(range(FIRST_SEED['score'], FIRST_SEED['score'] + n_s)))
    hours = (n_g * per_seed['geneval'] + n_s * per_seed['score']) / 3600
    return dict(rows=rows, need=need, level=level, steps=steps, how=how, seeds=seeds, per_seed=per_seed, hours=hours,
                arms=arms)

def toml(p:dict) -> str:
    import torch
    q = lambda s: json.dumps(s, ensure_ascii=False)
    head = [
        "# The second confirmatory study (is it the credit?), "
        "written by benchmarks/credit_prereg.py plan --write before",
        "# any of its runs. Recipe: the confirmatory study's "
        "(budget 'credit': fp32 eager, 4 prompts x 8, EMA, lr 1e-3,",
        f"# evaluated every {EVERY} steps on 1200 held-out images); DenseGRPO and flow_grpo_train4 train {H} steps.",
        f"# Equal CPU, fixed by step counts: geneval {p['steps']['geneval']} Flow-GRPO steps ({p['how']['geneval']});",
        f"# score {p['steps']['score']} ({p['how']['score']}).",
        f"# Margins: {MARGIN['geneval']} of held-out strict score (half of DenseGRPO's +0.063 at equal steps in",
        "# results/confirm: a smaller gain is not one a practitioner buys with 5.5x the NFE) and the equivalence band;",
        f"# {MARGIN['score']} of learned score (the exploratory study's). "
        "Each row is tested one-sided against 0 and, by",
        "# TOST, for equivalence within +-margin: holds / equivalent / does not hold / undecided (summary.judge).",
        f"# Seeds: the most a primary claim asks for either test at Holm's level {p['level']:.4f} (alpha / m, m = "
        f"{len(p['need'])}) and power 0.8: {p['need']}.",
        f"# Sized on {cpu_name()} ({torch.backends.cpu.get_cpu_capability()}), torch "
        f"{torch.__version__}: expected {p['hours']:.1f} CPU-hours (of {CPU_HOURS:g}): "
        f"geneval {p['per_seed']['geneval']:.0f} and score {p['per_seed']['score']:.0f} CPU s per seed.",
        "# Left out for the budget: TP-GRPO against the same controls; the papers' ablations (TP-GRPO without its",
        "# constraint or balancing, Stepwise's ODE values, DenseGRPO's calibration on the continuous reward); "
        "Flash-GRPO and",
        "# TempFlow-GRPO (not yet arms of the package when this was written).",
        'alpha = 0.05', 'power = 0.8', 'endpoints = ["collapses", "per_category", "cost"]', '', '[seeds]']
    head += [f'{t} = {json.dumps(s)}' for t, s in p['seeds'].items()]
    body = []
    for c in p['rows']:
        body += ['', '[[claim]]']
        for k in ('id', 'question', 'arm', 'other', 'task', 'claim', 'metric', 'k', 'test', 'margin', 'family', 'score',
                  'arm_steps', 'other_steps', 'sd', 'sd_from', 'note'):
            v = getattr(c, k)
            if v is None or (k == 'score' and v == 'strict'): continue
            body.append(f'{k} = {q(v) if isinstance(v, str) else v}')
    return '\n'.join(head + body) + '\n'

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('what', choices=('measure', 'plan'))
    ap.add_argument('--from', dest='src', default=None, help="measure: read the timing runs in this folder")
    ap.add_argument('--write', action='store_true', help=f"plan: write {DEST.relative_to(ROOT)}")
    a = ap.parse_args()
    if a.what == 'measure': return print(json.dumps(measure(a.src), indent=1))
    if not COST.is_file():
        sys.exit(f"credit_prereg.py: {COST} does not exist: run `benchmarks/credit_prereg.py measure` first")
    p = plan()
    text = toml(p)
    print(text)
    if a.write:
        if DEST.exists():
            sys.exit(f"credit_prereg.py: {DEST} exists: a pre-registration is written once, before its runs")
        from flowgrpo_nb.study.design import load_prereg
        tmp = DEST.with_name('.tmp-' + DEST.name); tmp.write_text(text)
        load_prereg(tmp)  # refused in one sentence if a row is wrong: nothing written
        tmp.replace(DEST)
        print(f"wrote {DEST}")

if __name__ == '__main__': main()
