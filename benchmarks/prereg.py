"""Plan and write the confirmatory study's pre-registration (`design/confirm_prereg.toml`) from what the pilot measured.

Why. A confirmatory study fixes, before its first run, one row per question with the metric its kind of claim needs,
the test and margin, the primary family that Holm corrects, and as many fresh seeds as the power computation asks at
the level the test will use (issue 38). The claims are fixed here, in `CLAIMS`; the numbers that depend on data are
read from files the package wrote, never typed in:

- the **level metric** (for "ends higher" claims) is the pilot's steadier one at the confirmatory horizon H: the final
  evaluation (the EMA model's) or the mean of the last two evaluations, whichever has the smaller paired SD (below) in
  the chosen recipe's 8 pilot seeds (`results/pilot/pilot.json`, `metrics_at_H`);
- the **planning SD** of a claim on the geneval task (held-out strict score) is sqrt(2) x the pilot's seed-to-seed SD of
  its metric minus the run's own base evaluation (`sd_paired`: the pilot ran Flow-GRPO only; two arms of one seed
  share the base evaluation's prompts and noise, which cancel in the pair, and train independently); of a claim on
  the score task (learned score, which the pilot did not train on) the exploratory study's paired SD on the same metric
  (`results/study/report.json`), said so in `sd_from`;
- the **seeds** per task are the most any primary claim of the task asks at the Holm level alpha / m
  (`design.prereg_seeds`), numbered from 2000 (geneval) and 3000 (score): never used by the exploratory study (0..7),
  the quick job (0..4) or the pilot (1000..1007).

    .venv/bin/python benchmarks/prereg.py                    # prints the plan: claims, metrics, planning SDs, seeds
    .venv/bin/python benchmarks/prereg.py --recipe safe --write   # writes design/confirm_prereg.toml (never overwrites)
"""
import argparse, json, math, statistics, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FIRST_SEED = dict(geneval=2000, score=3000)
LEVEL, SPEED = 0.02, 0.01   # margins: held-out strict score points (level: at H; speed: the curve's mean over 0..H)
CPU_HOURS = 12.0            # what the study may spend, on the machine that runs it (issue 38)
SECONDARY_SEEDS = 3         # seeds of a task none of whose claims stays primary: reported, underpowered, said so
CLAIMS = [  # one row per question; family primary (Holm over these) or secondary (reported as such)
    dict(id='D1', question='Does DenseGRPO end higher than Flow-GRPO on mini-GenEval?', arm='dense', other='flow_grpo',
         claim='level'),
    dict(id='T1', question='Does TP-GRPO end higher than Flow-GRPO on mini-GenEval?', arm='turning_point',
         other='flow_grpo', claim='level'),
    dict(id='S1', question='Does Stepwise-Flow-GRPO end higher than Flow-GRPO on mini-GenEval?', arm='stepwise',
         other='flow_grpo', claim='level'),
    dict(id='D1v', question='Does DenseGRPO learn faster than Flow-GRPO (a higher held-out curve over 0..H)?',
         arm='dense', other='flow_grpo', claim='speed'),
    dict(id='T1v', question='Does TP-GRPO learn faster than Flow-GRPO (a higher held-out curve over 0..H)?',
         arm='turning_point', other='flow_grpo', claim='speed'),
    dict(id='S1v', question='Does Stepwise-Flow-GRPO learn faster than Flow-GRPO (a higher held-out curve over 0..H)?',
         arm='stepwise', other='flow_grpo', claim='speed'),
    dict(id='D3', question="Does DenseGRPO's noise calibration help under a continuous reward (the learned score, "
                           "the paper's setting)?",
         arm='dense', other='dense_nocal', claim='level', task='score', score='learned'),
    dict(id='D2', question="Does DenseGRPO's noise calibration help under the few-level reward?", arm='dense',
         other='dense_nocal', claim='level', family='secondary'),
    dict(id='T2', question="Does TP-GRPO's turning-point rule help "
                           "(against the same ODE-completion credit without it)?",
         arm='turning_point', other='dense_nocal', claim='level', family='secondary'),
    dict(id='S2', question="Is Stepwise's per-step credit what helps "
                           "(against Flow-GRPO's credit on Stepwise's sampler)?",
         arm='stepwise', other='flow_grpo_ddim', claim='level', family='secondary'),
]
# Not in this study, for its CPU budget (each about 0.1-0.5 CPU-hours per seed more on an AVX2/AVX-512 CPU in fp32):
# TP-GRPO without its sign constraint or its balancing, Stepwise's ODE values (stepwise_ode), Flow-GRPO at DenseGRPO's
# NFE (flow_grpo_nfe), Flow-GRPO trained on the short window (flow_grpo_first4, flow_grpo_train4). The exploratory study
# ran them.

def load_pilot(path:Path, recipe:str) -> dict:
    "The chosen recipe's row of the pilot table, refused in one sentence if it is missing or was not accepted."
    if not path.exists(): sys.exit(f"prereg.py: {path} does not exist: run benchmarks/pilot.py table first")
    rows = json.loads(path.read_text())['candidates']
    if recipe not in rows: sys.exit(f"prereg.py: --recipe {recipe!r} is not in {path}; it has {', '.join(rows)}")
    return rows[recipe]

def level_metric(pilot:dict) -> tuple[str, int|None]:
    "The steadier level metric at H in the pilot: ('final', None) or ('last_mean', 2)."
    ms = pilot['metrics_at_H']
    return ('final', None) if ms['final']['sd_paired'] <= ms['last_mean2']['sd_paired'] else ('last_mean', 2)

def study_sd(claim:dict) -> tuple[float|None, int]:
    """The exploratory study's paired SD (and seeds) of `claim`'s contrast on its metric, or None where it did not run
    both arms."""
    from flowgrpo_nb.study.design import Claim
    from flowgrpo_nb.study.results import Report
    from flowgrpo_nb.study.summary import claim_diffs
    rep = Report.from_json(json.loads((ROOT / 'results' / 'study' / 'report.json').read_text()))
    sec = rep.tasks.get(claim['task'])
    d = claim_diffs(sec, Claim(**claim)) if sec else []
    return (statistics.stdev(d) if len(d) > 1 else None), len(d)

def plan(recipe:str, pilot_path:Path=ROOT / 'results' / 'pilot' / 'pilot.json') -> list[dict]:
    "Every claim row of the pre-registration, with its metric, margin, planning SD and where that SD was measured."
    pilot = load_pilot(pilot_path, recipe)
    lm, k = level_metric(pilot)
    rows = []
    for c in CLAIMS:
        r = dict(c, task=c.get('task', 'geneval'), test='superiority', family=c.get('family', 'primary'))
        if r['claim'] == 'level': r.update(metric=lm, margin=LEVEL, **({'k': k} if k else {}))
        else: r.update(metric='auc', margin=SPEED)
        if r['task'] == 'geneval':
            m = pilot['metrics_at_H']['last_mean2' if r['metric'] == 'last_mean' else r['metric']]
            r.update(sd=round(m['sd_paired'], 4),
                     sd_from=f"sqrt(2) x the seed-to-seed SD of Flow-GRPO's {r['metric']} minus its base evaluation at "
                             f"H in the pilot (recipe {recipe}, {m['n']} seeds)")
        else:
            sd, n = study_sd(r)
            r.update(sd=round(sd, 4) if sd else None,
                     sd_from=f"the exploratory study's paired SD of {r['metric']} ({n} seeds, world v1, "
                             "its recipe, 150 steps)")
        rows.append(r)
    return rows

def toml_text(rows:list[dict], seeds:dict, recipe:str, alpha:float=0.05, power:float=0.8, header:list|None=None) -> str:
    q = lambda v: json.dumps(v) if isinstance(v, (str, list)) else repr(v)
    lines = [f'# The confirmatory study\'s pre-registration, written by benchmarks/prereg.py --recipe {recipe} --write',
             f'# from results/pilot/pilot.json before any confirmatory run. Horizon, recipe and world: '
             'see the pilot table.',
             *(f'# {h}' for h in header or ()),
             f'alpha = {alpha}', f'power = {power}', 'endpoints = ["collapses", "per_category", "cost"]', '', '[seeds]']
    lines += [f'{t} = {json.dumps(list(s))}' for t, s in seeds.items()]
    for r in rows:
        lines += ['', '[[claim]]'] + [f'{key} = {q(v)}' for key, v in r.items() if v is not None]
    return '\n'.join(lines) + '\n'

def seed_cost(task:str, arms, timings:dict|None=None) -> float:
    """Expected CPU seconds of one seed of `task` under the confirm budget: a run of each arm and the base evaluation
    (`costs.run_cost`)."""
    from flowgrpo_nb.study.design import BUDGETS, TASKS, arm_config, budget_fields
    from flowgrpo_nb.study.costs import COSTS, run_cost, eval_cost, unit_costs
    fields = budget_fields(BUDGETS['confirm'], FIRST_SEED[task], task)
    cfgs = [arm_config(a, **fields) for a in arms]
    return sum(sum(run_cost(c, TASKS[task]['levels'], timings).values()) for c in cfgs) + \
        eval_cost(cfgs[0].eval_images, cfgs[0].K, unit_costs(cfgs[0], timings)) + COSTS['run']

def arms(rows:list[dict], task:str) -> list:
    """The arms a set of claim rows runs in `task`: Flow-GRPO, then each row's two, in order (as `design.prereg_arms`
    reads the file)."""
    return list(dict.fromkeys(['flow_grpo'] + [a for r in rows if r['task'] == task for a in (r['arm'], r['other'])]))

def fit_budget(rows:list[dict], hours:float=CPU_HOURS, cost=seed_cost,
               secondary_seeds:int=SECONDARY_SEEDS) -> tuple[list, dict, list]:
    """The rule that sizes the study to its budget, stated before the file is written: (1) the primary family's seeds at
    the Holm level (`design.prereg_seeds`); while its arms x seeds cost more than `hours`, the primary claim asking the
    most seeds (the later one on a tie) moves to the secondary family, with a note, and the family is sized again; (2)
    secondary claims join in the listed order (the moved ones last) while the total stays within `hours` (a task no
    primary claim sizes runs `secondary_seeds` seeds); the others are left out and listed. Returns (rows kept, seeds per
    task, left out)."""
    from flowgrpo_nb.study.design import load_prereg, prereg_seeds
    rows = [dict(r) for r in rows]
    tmp = ROOT / 'design' / '.prereg_plan.toml'
    tmp.parent.mkdir(exist_ok=True)
    def sized(rs):
        tmp.write_text(toml_text(rs, {}, 'plan'))
        try: return prereg_seeds(load_prereg(tmp))
        finally: tmp.unlink()
    while True:
        p = sized(rows)
        n = {t: k for t, k in p['task_seeds'].items() if k}
        prim = [r for r in rows if r['family'] == 'primary']
        spend = sum(cost(t, arms(prim, t)) * k for t, k in n.items())
        if spend <= hours * 3600 and None not in p['task_seeds'].values(): break
        need = {x['id']: (x['seeds'] if x['seeds'] is not None else 10 ** 9) for x in p['rows']}
        worst = max(reversed(prim), key=lambda r: need[r['id']])
        worst.update(family='secondary',
                     note=f"moved to the secondary family: it asks {need[worst['id']]} seeds at the Holm level "
                          f"alpha / {p['m']} = {p['level']:.4f}, which the study's {hours:g} CPU-hours do not buy")
        if len(prim) == 1: sys.exit('prereg.py: no primary claim fits the budget: nothing to run')
    kept, out = [r for r in rows if r['family'] == 'primary'], []
    # the moved ones last: they asked most
    for r in sorted((r for r in rows if r['family'] == 'secondary'), key=lambda r: 'note' in r):
        trial = kept + [r]
        seeds = n | {t: secondary_seeds for t in {x['task'] for x in trial} if t not in n}
        total = sum(cost(t, arms(trial, t)) * k for t, k in seeds.items())
        if total <= hours * 3600: kept.append(r)
        else: out.append(r)
    seeds = n | {t: secondary_seeds for t in {x['task'] for x in kept} if t not in n}
    order = [r['id'] for r in rows]
    return sorted(kept, key=lambda r: order.index(r['id'])), {t: list(range(FIRST_SEED[t], FIRST_SEED[t] + k))
                                                              for t, k in seeds.items()}, out

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--recipe', default='safe_nokl',
                    help="the pilot's chosen recipe (a row of results/pilot/pilot.json)")
    ap.add_argument('--pilot', default=str(ROOT / 'results' / 'pilot' / 'pilot.json'))
    ap.add_argument('--write', action='store_true', help='write design/confirm_prereg.toml (refused if it exists)')
    a = ap.parse_args(argv)
    import platform, torch
    from flowgrpo_nb.study.design import PREREG, load_prereg, prereg_seeds, holm_level
    from flowgrpo_nb.precision import cpu_name
    rows, seeds, out = fit_budget(plan(a.recipe, Path(a.pilot)))
    task_arms = {t: arms(rows, t) for t in seeds}
    hours = {t: seed_cost(t, task_arms[t]) * len(s) / 3600 for t, s in seeds.items()}
    m = sum(r['family'] == 'primary' for r in rows)
    cpu = f"{cpu_name()} ({torch.backends.cpu.get_cpu_capability()}), torch {torch.__version__}"
    header = [f"Sized on {cpu}: expected " + ', '.join(f'{t} {h:.1f}' for t, h in hours.items())
              + f" CPU-hours (of {CPU_HOURS:g}), fp32 eager.",
              'Left out for the budget: ' + (', '.join(r['id'] for r in out) if out else 'nothing') + '.']
    print(f"primary family: {m} claims, Holm's planning level alpha / m = {holm_level(0.05, m):.4f} (one-sided), "
          "power 0.8")
    print('| id | family | task | metric | margin | planning SD | SD from | note |\n|---|---|---|---|---|---|---|---|')
    for r in rows:
        print(f"| {r['id']} | {r['family']} | {r['task']} | {r['metric']}{r.get('k') or ''} | {r['margin']} | "
              f"{r['sd']} | {r['sd_from']} | {r.get('note') or ''} |")
    print('seeds per task: '
          + ', '.join(f'{t}: {len(s)} ({s[0]}..{s[-1]}), arms {" ".join(task_arms[t])}' for t, s in seeds.items()))
    print('\n'.join(header))
    if a.write:
        dest = ROOT / PREREG
        if dest.exists():
            sys.exit(f'prereg.py: {dest} exists: a pre-registration is written once (delete it by hand to '
                     'redo it before any run)')
        dest.write_text(toml_text(rows, seeds, a.recipe, header=header)); load_prereg(dest)
        print(f'wrote {dest}')

if __name__ == '__main__': main()
