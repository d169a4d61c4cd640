"""Plan and write the third study's pre-registration (`design/frontier_prereg.toml`): which method for a CPU budget?

Why (issue 64). The credit study's own runs, read post hoc, say that at equal NFE DenseGRPO is below Flow-GRPO and that
at equal CPU Flow-GRPO trained on steps 0-3 is above DenseGRPO; DenseGRPO with the latent value (05g_value) buys dense
credit at Flow-GRPO's NFE. This study tests those readings on fresh seeds, on the grid world's version 3 (`geneval3`,
reward partial@3: its held-out set can carry a claim), each row with a superiority and an equivalence verdict
(`summary.judge`: holds / equivalent / does not hold / undecided). Everything that depends on data is read from files
the package wrote, never typed in:

- **the pilot** (a comparison folder, `--pilot DIR`, default results/frontier_pilot/runs): its finished runs of seeds
  whose base evaluation exists; an arm with fewer than two such seeds is left out, said in the plan and the TOML;
- **equal CPU, fixed by step counts**: each arm's CPU seconds per step (the median over its seeds of each run's median
  step) and its calibration (counted once) price DenseGRPO's H steps; every other arm trains until it has spent as
  much, rounded to the evaluation grid (every EVERY steps); the CPU kind the pilot ran on is named;
- **equal NFE, exact**: the method registry's generator NFE per sample times the batch, DenseGRPO's calibration NFE
  (a count in its record) included: DenseGRPO at NFE_AT steps against Flow-GRPO at the steps that spend as much;
- **planning SDs**: each row's paired SD over the pilot's seeds, read as the study will read it (`summary.claim_diffs`,
  the pilot's run read at its last step where the registered reading lies beyond it); with 3-4 seeds an SD is uncertain
  (its 80% upper confidence limit is printed), so the plan uses the larger of it and the credit study's SD of the same
  contrast (results/credit/report.json, 22 seeds), or that study's largest where it has none;
- **the prompt component**: the pilot's per-prompt results (`stats.prompt_variance`, prompts resampled within their
  category, the mean over seeds), else the credit study's (from its seed-only and seeds-and-prompts intervals); the
  seeds-and-prompts interval decides the claims, so each row is powered for it: SD over seeds sqrt(sd^2 + n var_p) at n
  seeds (`stats.widened_ci` adds the two so);
- **margins**: MARGIN_FRACTION of Flow-GRPO's training gain in the pilot (its base evaluation to the last-two mean at
  its equal-CPU step), checked against the evaluation's redraw noise at 600 and 1200 images (results/eval_noise);
- **seeds**: the most a primary row asks for its superiority or its TOST test at Holm's level alpha / m, power 0.8,
  numbered from FIRST_SEED (never run before: design/*.toml and `BUDGETS` use 0-7003); the study must fit CPU_HOURS
  estimated with the package's `estimate_cost` on this machine: if it does not, the row asking most seeds moves to the
  secondary family (fewer primary rows, never fewer seeds than their power needs);
- **the reproducible mode** (results/machines/reproducible_cost.json): run in it when the study fits with its factor.

    .venv/bin/python benchmarks/frontier_prereg.py plan [--pilot DIR]            # prints the plan
    .venv/bin/python benchmarks/frontier_prereg.py plan --write [--pilot DIR]    # writes design/frontier_prereg.toml
"""
import argparse, functools, json, math, statistics, sys, tempfile, textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEST = ROOT/'design'/'frontier_prereg.toml'
PILOT = ROOT/'results'/'frontier_pilot'/'runs'
CREDIT = ROOT/'results'/'credit'/'report.json'
NOISE = ROOT/'results'/'eval_noise'/'eval_noise.json'
REPRO = ROOT/'results'/'machines'/'reproducible_cost.json'
TASK, BUDGET = 'geneval3', 'frontier'
H, NFE_AT, EVERY, K = 100, 50, 25, 2  # DenseGRPO's steps (the CPU budget), its steps read at equal NFE, grid, last k
FIRST_SEED, CPU_HOURS = 8000, 24.0
# of the training gain: half of what training buys is worth choosing a method for (the credit study's margin was half
# of DenseGRPO's gain at equal steps); a margin as large as the gain is not one
MARGIN_FRACTION = 1 / 2
ARMS = ('dense', 'flow_grpo', 'flow_grpo_train4', 'dense_latent')
LATENT = 'dense_latent'
# the credit study's contrast each row's SD is checked against (None: its largest)
CREDIT_SD = dict(P1='C1@cpu', P2='C2@nfe', P3=None, P4=None, P5=None)

def to_step(x:float) -> int: return max(EVERY, int(round(x / EVERY)) * EVERY)

def read_pilot(folder) -> tuple[dict, dict]:
    """({seed: {arm: RunResult}}: the finished runs of seeds with a base evaluation, {seed/arm: CPU kind}) of the
    pilot's comparison folder."""
    from flowgrpo_nb.checkpoint import read_json
    from flowgrpo_nb.study.runs import run_dir, base_file
    from flowgrpo_nb.study.results import run_report
    from flowgrpo_nb.study.design import TASKS
    from flowgrpo_nb.task import EvalReport
    folder, per_seed, kinds = Path(folder), {}, {}
    if not (folder/TASK).is_dir(): sys.exit(f"frontier_prereg.py: {folder} holds no {TASK}/ runs: give the pilot's "
                                            "comparison folder with --pilot DIR")
    for d in sorted((folder/TASK).glob('seed*')):
        seed, b = int(d.name[4:]), base_file(folder, TASKS[TASK]['evaluation'], int(d.name[4:]))
        if not b.is_file(): continue
        base = EvalReport.from_dict(read_json(b, 'the base evaluation'))
        for a in ARMS:
            r = run_dir(folder, TASK, seed, a)
            if not (r/'summary.json').is_file(): continue  # not finished (or not run)
            per_seed.setdefault(seed, {})[a] = run_report(r, base)
            prov = json.loads((r/'provenance.json').read_text()) if (r/'provenance.json').is_file() else {}
            kinds[f'{seed}/{a}'] = (prov.get('cpu') or {})
    return per_seed, kinds

def arm_costs(per_seed:dict) -> dict:
    "{arm: {step, calibration, seeds}}: median CPU seconds per step and of the calibration over the arm's seeds."
    out = {}
    for a in ARMS:
        rs = [runs[a] for runs in per_seed.values() if a in runs]
        if len(rs) < 2: continue
        out[a] = dict(step=statistics.median(r.cpu_seconds_per_step['step'] for r in rs),
                      calibration=statistics.median(r.calibration['cpu_seconds'] for r in rs), seeds=len(rs),
                      cal_nfe=statistics.median(r.calibration['nfe'] for r in rs))
    return out

def readings(cost:dict) -> dict:
    """{'cpu': {arm: steps at DenseGRPO's CPU seconds of H steps}, 'nfe': {dense: NFE_AT, flow_grpo: steps at its NFE},
    'how': words}: equal CPU from the measured costs, equal NFE from the registry's counts."""
    from flowgrpo_nb.study.design import arm_config, BUDGETS, budget_fields
    from flowgrpo_nb.method import method_of
    d = cost['dense']
    spend = d['calibration'] + H * d['step']
    cpu = {a: H if a == 'dense' else to_step((spend - c['calibration']) / c['step']) for a, c in cost.items()}
    nfe = {}
    for a in ('dense', 'flow_grpo'):
        cfg = arm_config(a, **budget_fields(BUDGETS['frontier_pilot'], FIRST_SEED, TASK, a))
        nfe[a] = method_of(cfg.method).nfe(cfg) * cfg.batch_size  # generator NFE of one optimizer step
    dense_nfe = d['cal_nfe'] + NFE_AT * nfe['dense']
    how = dict(cpu=f"DenseGRPO's {spend:.0f} CPU s ({H} steps x {d['step']:.2f} + calibration {d['calibration']:.0f}); "
                   + ', '.join(f"{a} {c['step']:.2f} s a step"
                               + (f" + {c['calibration']:.0f}" if c['calibration'] else '') + f" -> {cpu[a]}"
                               for a, c in cost.items() if a != 'dense'),
               nfe=f"DenseGRPO {NFE_AT} steps x {nfe['dense']:.0f} NFE + calibration {d['cal_nfe']:.0f} = "
                   f"{dense_nfe:.0f} NFE / Flow-GRPO's {nfe['flow_grpo']:.0f} a step -> "
                   f"{to_step(dense_nfe / nfe['flow_grpo'])} steps")
    return dict(cpu=cpu, nfe=dict(dense=NFE_AT, flow_grpo=to_step(dense_nfe / nfe['flow_grpo'])), how=how)

def claims(st:dict, arms) -> list[dict]:
    "The questions, in the file's order, for the arms the pilot priced (`arms`); `st`: `readings`."
    c, n = st['cpu'], st['nfe']
    row = lambda **kw: dict(claim='level', metric='last_mean', k=K, test='superiority', family='primary') | kw
    out = [
        row(id='P1', question=f'At equal CPU seconds, does Flow-GRPO trained on steps 0-3 only '
                              f'({c.get("flow_grpo_train4")} steps) end higher than DenseGRPO ({H} steps)?',
            arm='flow_grpo_train4', other='dense', arm_steps=c.get('flow_grpo_train4'), other_steps=H),
        row(id='P2', question=f'At equal NFE, does DenseGRPO ({n["dense"]} steps) end higher than Flow-GRPO '
                              f'({n["flow_grpo"]} steps)?',
            arm='dense', other='flow_grpo', arm_steps=n['dense'], other_steps=n['flow_grpo']),
        row(id='P3', question=f'At equal CPU seconds, does DenseGRPO with the latent value ({c.get(LATENT)} steps) end '
                              f'higher than Flow-GRPO ({c.get("flow_grpo")} steps)?',
            arm=LATENT, other='flow_grpo', arm_steps=c.get(LATENT), other_steps=c.get('flow_grpo')),
        row(id='P4', question=f'At equal CPU seconds, does DenseGRPO with the latent value ({c.get(LATENT)} steps) end '
                              f'higher than Flow-GRPO trained on steps 0-3 ({c.get("flow_grpo_train4")} steps)?',
            arm=LATENT, other='flow_grpo_train4', arm_steps=c.get(LATENT), other_steps=c.get('flow_grpo_train4')),
        row(id='P5', question=f'What the cheap value loses: at equal optimizer steps ({H}), does DenseGRPO with the '
                              'latent value end higher than DenseGRPO with its ode:rest values?',
            arm=LATENT, other='dense', arm_steps=H, other_steps=H),
    ]
    # the frontier: each arm's mean held-out score over its curve to the CPU budget (area / steps), against Flow-GRPO's
    out += [row(id=f'F{i + 1}', question=f'The frontier: is the area under {a}\'s held-out curve to the CPU budget '
                                          f'({c.get(a)} steps) larger than Flow-GRPO\'s ({c.get("flow_grpo")} steps)?',
                arm=a, other='flow_grpo', claim='speed', metric='auc', k=None, family='secondary', arm_steps=c.get(a),
                other_steps=c.get('flow_grpo'))
            for i, a in enumerate(('dense', 'flow_grpo_train4', LATENT))]
    return [r for r in out if r['arm'] in arms and r['other'] in arms]

def as_claim(r:dict):
    from flowgrpo_nb.study.design import Claim
    "Row `r` as the `Claim` the study will judge (its margin 1 until planned)."
    return Claim(**{k: v for k, v in r.items() if k in Claim.__dataclass_fields__}
                 | dict(margin=r.get('margin', 1.0), task=TASK))

def section(per_seed:dict):
    from flowgrpo_nb.study.results import TaskSection
    return TaskSection(TASK, 'few', arms={}, base={}, comparisons=[], per_seed={str(s): r for s, r in per_seed.items()})

def clipped(per_seed:dict, r:dict) -> tuple[dict, list]:
    "Row `r` read on the pilot: a reading beyond a pilot run's last step at that last step ([words] where so)."
    last = {a: min(runs[a].steps for runs in per_seed.values() if a in runs) for a in (r['arm'], r['other'])}
    out, said = dict(r), []
    for f, a in (('arm_steps', r['arm']), ('other_steps', r['other'])):
        if r.get(f) and r[f] > last[a]: out[f] = last[a]; said.append(f"{a} at {last[a]} (the pilot's last step)")
    return out, said

def pilot_sd(per_seed:dict, r:dict) -> dict:
    "{sd, n, ucl80, mean, said}: the row's paired SD over the pilot's seeds, read as the study reads it."
    from flowgrpo_nb.study.summary import claim_diffs
    from scipy import stats
    rr, said = clipped(per_seed, r)
    d = claim_diffs(section(per_seed), as_claim(rr))
    if len(d) < 2: return dict(sd=None, n=len(d), ucl80=None, mean=None, said=said)
    sd = statistics.stdev(d)
    return dict(sd=sd, n=len(d), mean=statistics.fmean(d), said=said,
                ucl80=sd * math.sqrt((len(d) - 1) / stats.chi2.ppf(0.2, len(d) - 1)))

def pilot_prompt_var(per_seed:dict, r:dict) -> float|None:
    """The variance the held-out prompts add to the study's effect of row `r`, which more seeds do not shrink: the
    prompt-resampling variance of the seeds' mean per-prompt difference less its evaluation noise (the mean over seeds
    of one seed's, over the seeds), floored at 0 (None: no per-prompt results)."""
    import numpy as np
    from flowgrpo_nb.study.summary import prompt_effects
    from flowgrpo_nb.study.stats import prompt_variance
    from flowgrpo_nb.study.design import TASKS
    from flowgrpo_nb.task import load_task
    rr, _ = clipped(per_seed, r)
    got = prompt_effects(section(per_seed), as_claim(rr))
    if got is None: return None
    D, W = got
    t = load_task(TASKS[TASK]['reward'])
    if t.category is None or len(t.eval_prompts) != D.shape[1]: return None
    strata = [t.category(p) for p in t.eval_prompts]
    w = W.sum(0)
    mean = np.divide((W * D).sum(0), w, out=np.zeros(D.shape[1]), where=w > 0)
    each = statistics.fmean(prompt_variance(d, x, strata) for d, x in zip(D, W))
    return max(prompt_variance(mean, w, strata) - each / len(D), 0.0)

def credit_sds(path=CREDIT) -> dict:
    "{contrast: {id, sd, n, vp}} of the credit study's report, the prompts' variance `vp` from its two intervals."
    out = {}
    for c in json.loads(Path(path).read_text())['contrasts']:
        if not c.get('sd') or not c.get('n'): continue
        vp = None
        if c.get('ci_prompts') and c.get('ci'):
            f = (c['ci_prompts'][1] - c['ci_prompts'][0]) / (c['ci'][1] - c['ci'][0])
            vp = max(f * f - 1, 0.0) * c['sd'] ** 2 / c['n']
        out[c['id']] = dict(id=c['id'], sd=c['sd'], n=c['n'], vp=vp)
    return out

@functools.lru_cache(maxsize=None)
def _seeds_for(test:str, sd:float, margin:float, level:float, power:float=0.8, most:int=10_000) -> int|None:
    "`stats.seeds_for`, kept: the plan asks the same questions again as rows leave the primary family."
    from flowgrpo_nb.study.stats import seeds_for
    return seeds_for(test, sd, margin, level, power, most=most)

@functools.lru_cache(maxsize=None)
def seeds_with_prompts(test:str, sd:float, vp:float, margin:float, level:float, power:float=0.8,
                       most:int=500) -> int|None:
    """The fewest seeds >= 2 at which `test` on the seeds-and-prompts interval reaches `power` (None: more than `most`):
    `stats.seeds_for` with the prompts' variance `vp`, kept as `_seeds_for` is."""
    from flowgrpo_nb.study.stats import seeds_for
    return seeds_for(test, sd, margin, level, power, most=most, vp=vp)

def margin_of(per_seed:dict, st:dict, fraction:float=MARGIN_FRACTION) -> tuple[float, dict]:
    "MARGIN_FRACTION of Flow-GRPO's training gain at its equal-CPU step in the pilot, and the numbers behind it."
    from flowgrpo_nb.study.summary import run_metric
    up = min(st['cpu']['flow_grpo'], min(rs['flow_grpo'].steps for rs in per_seed.values() if 'flow_grpo' in rs))
    g = [run_metric(rs['flow_grpo'], 'last_mean', 'strict', K, None, up) - rs['flow_grpo'].curve[0].eval
         for rs in per_seed.values() if 'flow_grpo' in rs]
    gain = statistics.fmean(g)
    noise = json.loads(NOISE.read_text())['sizes']
    return round(fraction * gain, 3), dict(fraction=fraction, gain=gain, step=up, seeds=len(g),
                                                  redraw={n: noise[n]['redraw_sd'] for n in ('600', '1200')})

def cpu_kind(kinds:dict) -> str:
    "The one CPU kind the pilot's runs record (several: each named)."
    k = sorted({f"{v.get('cpu', '?')} ({v.get('capability', '?')}), torch {v.get('torch', '?')}"
                for v in kinds.values()})
    return ' and '.join(k) or 'not recorded'

def toml_text(p:dict, seeds:list) -> str:
    "The pre-registration's text: header (the plan's reasons) and rows."
    q = lambda s: json.dumps(s, ensure_ascii=False)
    lines = [f'# {w}' for h in p['header'] for w in textwrap.wrap(h, 116, subsequent_indent='  ')]
    lines += ['alpha = 0.05', 'power = 0.8', 'endpoints = ["collapses", "per_category", "cost"]', '', '[seeds]',
              f'{TASK} = {json.dumps(seeds)}']
    for r in p['rows']:
        lines += ['', '[[claim]]']
        for k in ('id', 'question', 'arm', 'other', 'task', 'claim', 'metric', 'k', 'test', 'margin', 'family',
                  'arm_steps', 'other_steps', 'sd', 'sd_from', 'note'):
            v = r.get(k)
            if v is None: continue
            lines.append(f'{k} = {q(v) if isinstance(v, str) else v}')
    return '\n'.join(lines) + '\n'

def study_cost(p:dict, n:int) -> float:
    "CPU seconds of the study at `n` seeds, the package's estimate (`estimate_cost`) on this machine."
    from flowgrpo_nb.study.design import CompareConfig
    from flowgrpo_nb.study.costs import estimate_cost
    with tempfile.TemporaryDirectory() as d:
        f = Path(d)/'prereg.toml'
        f.write_text(toml_text(p, list(range(FIRST_SEED, FIRST_SEED + n))))
        return estimate_cost(CompareConfig(BUDGET, prereg=str(f)), workers=2)['core_seconds']

def plan(per_seed:dict, kinds:dict, credit:dict|None=None, prompt_var:float|None=None, hours:float=CPU_HOURS,
         cost_of=None, fraction:float=MARGIN_FRACTION) -> dict:
    """The plan from the pilot's runs `per_seed`: rows with steps, margins, SDs and seeds, the seeds, cost, reasons.
    `credit`: `credit_sds` (default: results/credit's; {}: none); `prompt_var`: over the pilot's and
    credit's; `cost_of(plan, n)`: CPU seconds at n seeds (default `study_cost`)."""
    from flowgrpo_nb.study.stats import holm_level
    credit = credit_sds() if credit is None else credit
    cost_of = cost_of or study_cost
    cost = arm_costs(per_seed)
    if not {'dense', 'flow_grpo'} <= set(cost):
        sys.exit("frontier_prereg.py: the pilot has fewer than two finished seeds of dense or flow_grpo: nothing to "
                 "plan from")
    st = readings(cost)
    margin, why = margin_of(per_seed, st, fraction)
    rows = claims(st, set(cost))
    # a row without a contrast of its own in the credit study: its largest SD, with its largest prompt variance
    big = credit and max(credit.values(), key=lambda v: v['sd'])
    largest = credit and dict(big, id=f"largest, {big['id']}",
                              vp=max((v['vp'] for v in credit.values() if v['vp'] is not None), default=None))
    for r in rows:
        r |= dict(task=TASK, margin=margin)
        if r['family'] != 'primary': continue
        ps = pilot_sd(per_seed, r)
        ref = CREDIT_SD.get(r['id'])
        cr = credit.get(ref) or largest or None
        cid, cvp = (cr['id'], cr['vp'] or 0.0) if cr else (None, 0.0)
        vp = prompt_var if prompt_var is not None else pilot_prompt_var(per_seed, r)
        if prompt_var is not None: vp_from = 'given'
        elif vp is None: vp, vp_from = cvp, f"the credit study's {cid} (the pilot logs none)"
        else:
            vp_from = f"the larger of the pilot's per-prompt results ({vp:.2e}) and the credit study's {cid}"
            vp = max(vp, cvp)
        if ps['sd'] is None and not cr: sys.exit(f"frontier_prereg.py: row {r['id']} has no SD to plan from: neither "
                                                 "two pilot seeds of its arms nor a credit study")
        sd = max(x for x in (ps['sd'], cr and cr['sd']) if x is not None)
        r.update(sd=round(sd, 4), pilot=ps, var_prompts=vp)
        said = [f"the pilot's paired SD {ps['sd']:.4f} over {ps['n']} seeds (80% upper limit {ps['ucl80']:.4f}, mean "
                f"{ps['mean']:+.4f}" + ''.join(f"; {x}" for x in ps['said']) + ')' if ps['sd'] is not None else
                f"no pilot SD ({ps['n']} seeds)"]
        if cr: said.append(f"the credit study's {cr['sd']:.4f} ({cr['id']}, {cr['n']} seeds)")
        r['sd_from'] = (f"the larger of {' and '.join(said)}; prompt variance {vp:.2e} from {vp_from}, powered on the "
                        f"seeds-and-prompts interval; margin {margin} = {fraction:.2g} of Flow-GRPO's training gain "
                        f"{why['gain']:+.4f} in the pilot (base to step {why['step']}, {why['seeds']} seeds); "
                        f"redraw SD of an evaluation {why['redraw']['600']:.4f} at 600 images, "
                        f"{why['redraw']['1200']:.4f} at 1200 (results/eval_noise)")
    moved = []
    while True:
        prim = [r for r in rows if r['family'] == 'primary']
        level = holm_level(0.05, len(prim))
        for r in prim:
            r['need'] = {t: seeds_with_prompts(t, r['sd'], r['var_prompts'], margin, level)
                         for t in ('superiority', 'equivalence')}
            r['seed_only'] = {t: _seeds_for(t, r['sd'], margin, level) for t in ('superiority', 'equivalence')}
        asks = lambda r: math.inf if None in r['need'].values() else max(r['need'].values())
        n = max(asks(r) for r in prim)
        secs = cost_of(dict(rows=rows, header=[]), n) if n < math.inf else math.inf
        if secs <= hours * 3600 or len(prim) == 1: break
        worst = max(prim, key=asks)
        worst.update(family='secondary', note=f"moved to the secondary family: its {asks(worst)} seeds do not fit "
                                              f"{hours:g} CPU-hours")
        moved.append(worst['id'])
    per_seed_cost = cost_of(dict(rows=rows, header=[]), 1)
    n_fit = int(hours * 3600 // per_seed_cost)
    repro = json.loads(REPRO.read_text())['steps']
    factor = repro['reproducible']['step']['median'] / repro['default']['step']['median']
    return dict(rows=rows, cost=cost, readings=st, margin=margin, why=why, level=level, m=len(prim), seeds=n,
                seconds=secs, hours=hours, moved=moved, fits=secs <= hours * 3600, n_fit=n_fit, per_seed=per_seed_cost,
                kind=cpu_kind(kinds), factor=factor,
                reproducible=secs * factor <= hours * 3600, latent=LATENT in cost, pilot_seeds=sorted(per_seed))

def measured_seed(per_seed:dict, p:dict) -> float:
    """CPU seconds of one seed of the plan priced on the pilot's own records: each arm's steps at its measured cost per
    step, its calibration and its evaluations (the pilot's per evaluation), and the base evaluation of the seed."""
    from flowgrpo_nb.study.design import prereg_steps, prereg_arms, Prereg
    pre = Prereg('plan', 0.05, 0.8, [as_claim(r) for r in p['rows']], (), {TASK: [FIRST_SEED]})
    steps, total = prereg_steps(pre).get(TASK, {}), 0.0
    for a in prereg_arms(pre)[TASK]:
        rs = [runs[a] for runs in per_seed.values() if a in runs]
        ev = statistics.median(r.eval_cpu_seconds / (len(r.curve) - 1) for r in rs)
        n = steps.get(a, H)
        total += p['cost'][a]['calibration'] + n * p['cost'][a]['step'] + (n // EVERY) * ev
    return total + ev

def powered(p:dict, r:dict) -> dict:
    """What the seeds that fit the budget can decide for row `r`: the smallest margin each test reaches with power 0.8
    at its level, on the seeds-and-prompts interval."""
    from flowgrpo_nb.study.stats import mde_one_sided, tost_margin
    n = p['n_fit']
    if not 2 <= n <= 500: return {}
    eff = math.sqrt(r['sd'] ** 2 + n * r['var_prompts'])
    return dict(superiority=mde_one_sided(eff, n, p['level']), equivalence=tost_margin(eff, n, p['level']))

def header(p:dict) -> list[str]:
    "The TOML's header: what the plan read, decided and left out."
    import torch
    from flowgrpo_nb.precision import cpu_name
    from flowgrpo_nb.study.design import BUDGETS
    b, st = BUDGETS[BUDGET], p['readings']
    prim = [r for r in p['rows'] if r['family'] == 'primary']
    need = lambda r: 'over 500' if None in r['need'].values() else max(r['need'].values())
    arms = ', '.join(f"{a} ({c['seeds']} seeds)" for a, c in p['cost'].items())
    h = [f"The third study (which method for a CPU budget?), written by benchmarks/frontier_prereg.py plan --write",
         f"before any of its runs. Recipe: the frontier pilot's (budget '{BUDGET}': fp32 eager, 4 prompts x 8, EMA, lr "
         f"1e-3, on {TASK}, evaluated every {b['eval_every']} steps on {b['eval_images']} held-out images).",
         f"Pilot: seeds {p['pilot_seeds']}, arms {arms}"
         f", priced on {p['kind']}.",
         f"Equal CPU, fixed by step counts: {st['how']['cpu']}.",
         f"Equal NFE, exact (the method registry's NFE per sample): {st['how']['nfe']}."]
    if not p['latent']:
        h.append(f"NOT PLANNED: the latent-value arm ({LATENT}) has no finished pilot runs of two seeds yet; its rows "
                 "(P3-P5, F3) are absent.")
    h += [f"Margin {p['margin']} of held-out strict score: {p['why']['fraction']:.2g} of Flow-GRPO's training gain "
          f"{p['why']['gain']:+.4f} in the pilot (base to step {p['why']['step']}); the evaluation's redraw SD is "
          f"{p['why']['redraw']['600']:.4f} at 600 images and {p['why']['redraw']['1200']:.4f} at 1200.",
          f"Seeds: the most a primary row asks for its superiority or TOST test on the seeds-and-prompts interval at "
          f"Holm's level {p['level']:.4f} (m = {p['m']}), power 0.8: "
          + ', '.join(f"{r['id']} {need(r)}" for r in prim) + '.',
          f"Sized on {cpu_name()} ({torch.backends.cpu.get_cpu_capability()}), torch {torch.__version__}: "
          f"{p['seconds'] / 3600:.1f} CPU-hours estimated (of {p['hours']:g}), interleaved by seed.",
          (f"Reproducible mode: yes (--set reproducible=true: {p['factor']:.2f}x the CPU, "
           f"{p['seconds'] * p['factor'] / 3600:.1f} h, fits)" if p['reproducible'] else
           f"Reproducible mode: no ({p['factor']:.2f}x the CPU would be {p['seconds'] * p['factor'] / 3600:.1f} h, "
           "over "
           f"{p['hours']:g}): each seed runs on one CPU kind, recorded, where its runs retrain bitwise."),
          "Secondary: the frontier (F rows: mean held-out score over each arm's curve to the CPU budget, against "
          "Flow-GRPO)" + (f"; moved from the primary family for the budget: {', '.join(p['moved'])}" if p['moved'] else
                          '') + '.',
          "Left out: TempFlow-GRPO, Flash-GRPO and TP-GRPO with the latent value (no pilot run prices their equal-CPU "
          "steps or SDs: they would be typed, not measured); the continuous reward (no margin that can say "
          "something)."]
    return h

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('what', choices=('plan',))
    ap.add_argument('--pilot', default=str(PILOT), help="the pilot's comparison folder")
    ap.add_argument('--fraction', type=float, default=MARGIN_FRACTION, help="the margin: this fraction of the gain")
    ap.add_argument('--write', action='store_true', help="write design/frontier_prereg.toml (never overwrites)")
    ap.add_argument('--hours', type=float, default=CPU_HOURS, help="the CPU-hours the study may take")
    ap.add_argument('--decision', action='append', default=[],
                    help="a decision the plan's numbers leave to its author, with its reason (a header line each)")
    a = ap.parse_args()
    if not 0 < a.fraction < 1:
        sys.exit(f"frontier_prereg.py: --fraction {a.fraction}: a fraction of the gain, in (0, 1)")
    if not 0 < a.hours <= 1000: sys.exit(f"frontier_prereg.py: --hours {a.hours}: CPU-hours, in (0, 1000]")
    if a.write and a.fraction != MARGIN_FRACTION and not a.decision:
        sys.exit(f"frontier_prereg.py: --fraction {a.fraction} is not the default {MARGIN_FRACTION:.2g}: say why with "
                 "--decision TEXT")
    per_seed, kinds = read_pilot(a.pilot)
    p = plan(per_seed, kinds, fraction=a.fraction, hours=a.hours)
    p['header'] = header(p) + [f"Decision: {d}" for d in a.decision]
    seeds = list(range(FIRST_SEED, FIRST_SEED + p['seeds'])) if p['fits'] else []
    print(toml_text(p, seeds))
    for r in p['rows']:
        if 'need' not in r: continue
        pm = powered(p, r)
        print(f"{r['id']} ({r['family']}): pilot SD {r['pilot']['sd']:.4f} (n {r['pilot']['n']}), planning SD "
              f"{r['sd']}, "
              f"prompt var {r['var_prompts']:.2e}; seeds on seeds and prompts {r['need']}, on seeds only "
              f"{r['seed_only']}; at the {p['n_fit']} seeds that fit, margins powered: "
              + ', '.join(f"{t} {v:.4f}" for t, v in pm.items()))
    print(f"one seed: {p['seconds'] / max(p['seeds'], 1) if p['fits'] else p['per_seed']:.0f} CPU s estimated "
          f"(estimate_cost, this machine), {measured_seed(per_seed, p):.0f} priced on the pilot's own records")
    if not p['fits']:
        print(f"does not fit: even one primary row asks more than the {p['n_fit']} seeds that {p['hours']:g} CPU-hours "
              f"buy at margin {p['margin']}")
    if a.write:
        if DEST.exists():
            sys.exit(f"frontier_prereg.py: {DEST} exists: a pre-registration is written once, before its runs")
        if not p['fits']: sys.exit(f"frontier_prereg.py: the plan does not fit {p['hours']:g} CPU-hours at margin "
                                   f"{p['margin']}: nothing written (a larger --fraction, or more hours)")
        from flowgrpo_nb.study.design import load_prereg
        from flowgrpo_nb.checkpoint import write_text
        text = toml_text(p, seeds)
        with tempfile.TemporaryDirectory() as d:
            (Path(d)/DEST.name).write_text(text)
            load_prereg(Path(d)/DEST.name)  # refused in one sentence if a row is wrong: nothing written
        write_text(DEST, text)
        print(f"wrote {DEST}")

if __name__ == '__main__': main()
