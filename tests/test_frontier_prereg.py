"""The third study's planner (benchmarks/frontier_prereg.py) on a planted pilot: its step counts follow from the planted
costs, its seeds from the planted SDs; budget 'frontier' runs what the file fixes and refuses without it."""
import math, statistics, sys, tomllib
import pytest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/'benchmarks'))
import frontier_prereg as fp
from flowgrpo_nb.study.results import fake_run
from flowgrpo_nb.study.stats import seeds_for, holm_level

DENSE = [.20, .22, .21, .23]        # each seed's DenseGRPO score (flat after its base point)
TRAIN4 = [.21, .27, .22, .31]       # flow_grpo_train4's
LATENT = [.19, .20, .24, .22]
FREE = lambda plan, n: 1000.0 * n  # 86 seeds fit in 24 CPU-hours: every plan here fits

def pilot(latent:bool=True) -> dict:
    "Four seeds: dense 6 CPU s a step + 14 s calibration (3520 NFE), Flow-GRPO 3 s, train4 2 s, latent 2.5 s."
    flat = lambda v, n: [.15] + [v] * n
    out = {}
    for i in range(4):
        out[7000 + i] = dict(dense=fake_run(flat(DENSE[i], 4), cpu=6.0, cal=(3520, 14.0)),
                             flow_grpo=fake_run(flat(.25, 10), cpu=3.0), flow_grpo_train4=fake_run(flat(TRAIN4[i], 15),
                                                                                                     cpu=2.0))
        if latent: out[7000 + i]['dense_latent'] = fake_run(flat(LATENT[i], 11), cpu=2.5)
    return out

def test_steps_follow_from_the_planted_costs_and_seeds_from_the_planted_sds():
    p = fp.plan(pilot(), {}, credit={}, prompt_var=0.0, cost_of=FREE)
    rows = {r['id']: r for r in p['rows']}
    spend = 14.0 + fp.H * 6.0  # DenseGRPO's H steps and its calibration, counted once
    want = dict(dense=fp.H, flow_grpo=fp.to_step(spend / 3), flow_grpo_train4=fp.to_step(spend / 2),
                dense_latent=fp.to_step(spend / 2.5))
    assert p['readings']['cpu'] == want == dict(dense=100, flow_grpo=200, flow_grpo_train4=300, dense_latent=250)
    assert (rows['P1']['arm_steps'], rows['P1']['other_steps']) == (300, 100)
    # equal NFE, exact: dense 55 NFE a sample (10 + 45 ode:rest), Flow-GRPO 10; 32 samples a step; calibration 3520
    assert (rows['P2']['arm_steps'], rows['P2']['other_steps']) == (fp.NFE_AT, fp.to_step((3520 + 50 * 32 * 55) / 320))
    assert (rows['P3']['arm_steps'], rows['P3']['other_steps']) == (250, 200)
    assert (rows['P5']['arm_steps'], rows['P5']['other_steps']) == (fp.H, fp.H), 'the cheap value at equal steps'
    assert p['margin'] == round(fp.MARGIN_FRACTION * .10, 3), "half of Flow-GRPO's planted gain (.15 -> .25)"
    prim = [r for r in p['rows'] if r['family'] == 'primary']
    level = holm_level(0.05, len(prim))
    assert len(prim) == 5 and p['level'] == level
    sd1 = statistics.stdev(t - d for t, d in zip(TRAIN4, DENSE))
    assert rows['P1']['sd'] == round(sd1, 4) and rows['P1']['pilot']['n'] == 4
    want = {t: seeds_for(t, round(sd1, 4), p['margin'], level) for t in ('superiority', 'equivalence')}
    assert rows['P1']['need'] == want and p['seeds'] >= max(want.values())
    assert p['seeds'] == max(max(r['need'].values()) for r in prim)
    assert all(r['family'] == 'secondary' and r['metric'] == 'auc' for r in p['rows'] if r['id'].startswith('F'))

def test_prompts_and_the_budget_cost_seeds_or_rows_never_fewer_seeds():
    base = fp.plan(pilot(latent=False), {}, credit={}, prompt_var=0.0, cost_of=FREE)
    wide = fp.plan(pilot(latent=False), {}, credit={}, prompt_var=1e-4, cost_of=FREE)
    assert all(w['need']['equivalence'] >= r['need']['equivalence']
               for r, w in zip(base['rows'], wide['rows']) if 'need' in r), 'prompts add variance seeds cannot remove'
    # a budget one seed short of what the primary family asks: the row asking most leaves it, the rest keep their seeds
    n0 = base['seeds']
    tight = fp.plan(pilot(latent=False), {}, credit={}, prompt_var=0.0, cost_of=FREE, hours=(n0 - 1) * 1000.0 / 3600)
    asks = lambda r: max(r['need'].values())
    assert tight['moved'][0] == max((r for r in base['rows'] if r['family'] == 'primary'), key=asks)['id']
    assert all('do not fit' in r['note'] for r in tight['rows'] if r['id'] in tight['moved'])
    prim = [r for r in tight['rows'] if r['family'] == 'primary']
    level = holm_level(0.05, len(prim))
    assert tight['fits'] and tight['seeds'] <= n0 - 1 and tight['seeds'] == max(
        seeds_for(t, r['sd'], tight['margin'], level) for r in prim for t in ('superiority', 'equivalence'))

def test_without_the_latent_arm_the_plan_says_so():
    p = fp.plan(pilot(latent=False), {}, credit={}, prompt_var=0.0, cost_of=FREE)
    assert not p['latent'] and {r['id'] for r in p['rows']} == {'P1', 'P2', 'F1', 'F2'}
    assert any('NOT PLANNED' in line and fp.LATENT in line for line in fp.header(p | dict(header=[])))

def test_the_frontier_budget_runs_the_file_and_refuses_without_it(tmp_path):
    from flowgrpo_nb.study.design import CompareConfig, BUDGETS, load_prereg
    missing = tmp_path/'frontier_prereg.toml'
    with pytest.raises(ValueError, match=f"budget 'frontier' runs the seeds and arms of the pre-registration "
                                         f"{missing}, which does not exist"):
        CompareConfig('frontier', prereg=str(missing))
    p = fp.plan(pilot(), {}, credit={}, prompt_var=0.0, cost_of=FREE)
    p['header'] = fp.header(p)
    seeds = list(range(fp.FIRST_SEED, fp.FIRST_SEED + 3))
    missing.write_text(fp.toml_text(p, seeds))
    pre = load_prereg(missing)
    c = CompareConfig('frontier', prereg=str(missing))
    assert c.task_seeds('geneval3') == tuple(seeds) and BUDGETS['frontier']['by_seed']
    steps = {a: c.train_config(a, seeds[0], 'geneval3').steps for a in c.task_arms('geneval3')}
    assert steps == dict(flow_grpo=275, flow_grpo_train4=300, dense=100, dense_latent=250), \
        'each arm to the longest reading it takes part in (Flow-GRPO: the equal-NFE one)'
    assert c.train_config('dense', seeds[0], 'geneval3').eval_every == 25  # every reading's step is evaluated
    assert all(s % 25 == 0 for r in pre.claims for s in (r.arm_steps, r.other_steps))
    # fresh seeds: none of the earlier pre-registrations' or budgets' seeds (the frontier's own file aside)
    used = {s for f in (ROOT/'design').glob('*.toml') if f.name != fp.DEST.name
            for v in tomllib.loads(f.read_text()).get('seeds', {}).values() for s in v}
    for b in BUDGETS.values():
        s = b['seeds']
        used |= set() if s == 'prereg' else {x for v in s.values() for x in v} if isinstance(s, dict) else set(s)
    assert not used & set(range(fp.FIRST_SEED, fp.FIRST_SEED + 200))
