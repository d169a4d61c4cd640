"""Checks of issue 38's statistics: the pre-registration file, power at the Holm level a claim's test uses, and the
agreement of every verdict with its power statement (the notebooks 06a, 06b, 06e and 06g show each)."""
import dataclasses, json, math
from pathlib import Path

import pytest
from scipy import stats, optimize

from flowgrpo_nb.study.design import load_prereg, prereg_seeds
from flowgrpo_nb.study.results import Report
from flowgrpo_nb.study.stats import power_agreement, seeds_for, mde
from flowgrpo_nb.study.summary import fake_report, with_power

ROOT = Path(__file__).resolve().parent.parent

def row(id, arm='dense', other='flow_grpo', metric='auc', claim='speed', test='superiority', margin=0.02, **kw):
    extra = ''.join(f"{k} = {json.dumps(v)}\n" for k, v in kw.items())
    return (f'[[claim]]\nid = "{id}"\nquestion = "?"\narm = "{arm}"\nother = "{other}"\ntask = "geneval"\n'
            f'claim = "{claim}"\nmetric = "{metric}"\ntest = "{test}"\nmargin = {margin}\n' + extra + '\n')

def test_prereg_loads_and_sizes_the_primary_family(tmp_path):
    p = tmp_path/'confirm_prereg.toml'
    p.write_text('alpha = 0.05\npower = 0.8\nendpoints = ["collapses", "cost"]\n\n' + row('D1', sd=0.03)
                 + row('T1', arm='turning_point', metric='last_mean', claim='level', k=3, sd=0.05)
                 + row('S4', arm='stepwise', metric='steps_to', target=0.6, margin=25, family='secondary'))
    pre = load_prereg(p)
    assert [c.id for c in pre.primary] == ['D1', 'T1'] and pre.endpoints == ('collapses', 'cost')
    plan = prereg_seeds(pre)
    assert plan['level'] == 0.05 / 2
    assert [r['seeds'] for r in plan['rows']] == [seeds_for('superiority', 0.03, 0.02, 0.025),
                                                  seeds_for('superiority', 0.05, 0.02, 0.025)]
    assert plan['task_seeds'] == {'geneval': max(r['seeds'] for r in plan['rows'])}

def test_prereg_refuses_a_duplicate_contrast(tmp_path):
    p = tmp_path/'confirm_prereg.toml'
    p.write_text(row('D1') + row('D1s', arm='flow_grpo', other='dense'))  # the same question, arms the other way round
    with pytest.raises(ValueError, match=r"confirm_prereg.toml: claim 2 \(D1s\) "
                                         r"repeats the contrast of claim 1 \(D1\)"):
        load_prereg(p)
    for bad, msg in ((row('X', arm='densest'), "arms 'densest'"), (row('X', metric='median'), "metric 'median'"),
                     (row('X', test='tost'), "test 'tost'"),
                     (row('X', metric='final'), "metric 'final' for a speed claim")):
        p.write_text(bad)
        with pytest.raises(ValueError, match=msg): load_prereg(p)

def test_power_at_the_holm_level_on_a_fake_report():
    rep = fake_report(dict(flow_grpo=.56, dense=.60, dense_nocal=.585, turning_point=.575))
    ran = [c for c in rep.contrasts if c.n]
    d1 = next(c for c in ran if c.id == 'D1')
    assert d1.family_size == len(ran) and d1.level == 0.05 / len(ran)
    crit = stats.t.ppf(1 - 0.05 / len(ran), d1.n - 1)  # by hand: the one-sided paired t-test at alpha / m
    hand = optimize.brentq(lambda e: stats.nct.sf(crit, d1.n - 1, e * math.sqrt(d1.n) / d1.sd) - 0.8, 1e-9, 10 * d1.sd)
    assert d1.mde == pytest.approx(hand, rel=1e-6) and d1.mde > mde(d1.sd, d1.n)  # stricter than the two-sided 5% test
    for c in ran: assert power_agreement(dataclasses.asdict(c), c.family_size) == [], c.id

def test_the_study_verdicts_agree_with_their_power():
    study = Report.from_json(json.loads((ROOT/'results'/'study'/'report.json').read_text()))
    restated = [c for c in with_power(study.contrasts) if c.n]
    assert all(power_agreement(dataclasses.asdict(c), c.family_size) == [] for c in restated)
    old = next(c for c in study.contrasts if c.id == 'D1')  # as written: two-sided at 5%, which the verdicts never used
    assert power_agreement(dataclasses.asdict(dataclasses.replace(old, level=0.05, family_size=21)), 21)

def test_the_confirm_budget_runs_the_prereg_seeds_and_arms(tmp_path, monkeypatch):
    """Budget confirm takes its seeds and arms from the pre-registration file; without the file, one sentence that names
    it."""
    from flowgrpo_nb.study import design
    from flowgrpo_nb.study.design import CompareConfig, budget_of
    p = tmp_path/'confirm_prereg.toml'
    monkeypatch.setattr(design, 'prereg_file', lambda *a, **k: p)
    with pytest.raises(ValueError, match=f"budget 'confirm' runs the seeds and arms of the pre-registration {p}, "
                                         "which does not exist"):
        CompareConfig('confirm')
    p.write_text('[seeds]\ngeneval = [2000, 2001, 2002]\n\n' + row('D1', arm='dense', sd=0.03)
                 + row('T2', arm='turning_point', other='dense_nocal', family='secondary'))
    c = CompareConfig('confirm')
    assert c.tasks == ('geneval',) and c.task_seeds('geneval') == (2000, 2001, 2002)
    assert c.task_arms('geneval') == ('flow_grpo', 'dense', 'turning_point', 'dense_nocal'), \
        'the reference first, then the claims\' arms'
    assert (c.train_config('dense', 2000).steps == budget_of('confirm')['steps']
            and not c.train_config('dense', 2000).fast)
    p.write_text('[seeds]\ngeneval = [2000]\n\n' + row('D3', other='dense_nocal').replace('"geneval"', '"score"'))
    with pytest.raises(ValueError, match=r"claim 1 \(D3\): task 'score' has no seeds in \[seeds\]"): load_prereg(p)

def test_a_budget_reads_each_arms_steps_from_its_claims(tmp_path):
    """Equal compute fixed by step counts: an arm a claim reads further (`other_steps`) trains that far, the others the
    budget's steps; the runs are scheduled seed by seed; a claim reads each run up to its own step."""
    from flowgrpo_nb.study.design import CompareConfig, BUDGETS
    from flowgrpo_nb.study.costs import job_costs, schedule
    from flowgrpo_nb.study.summary import claim_diffs, judge, last_mean
    from flowgrpo_nb.study.results import fake_run, TaskSection
    p = tmp_path/'credit_prereg.toml'
    p.write_text('[seeds]\ngeneval = [5000, 5001]\n\n'
                 + row('C1', other='flow_grpo_train4', metric='last_mean', claim='level', k=2, other_steps=100)
                 + row('C2', metric='last_mean', claim='level', k=2, other_steps=225))
    c = CompareConfig('credit', prereg=str(p))
    assert [c.train_config(a, 5000, 'geneval').steps for a in ('flow_grpo', 'dense', 'flow_grpo_train4')] == \
        [225, 100, 100]
    order = schedule(job_costs(c), 2, by_seed=True)[0]
    seed = lambda k: k[2] if k[0] == 'base' else k[1]
    assert [seed(k) for k in order] == sorted(seed(k) for k in order), 'every job of seed 5000 before any of 5001'
    assert BUDGETS['credit']['by_seed'] and not BUDGETS['confirm'].get('by_seed')
    # reading the runs: Flow-GRPO to step 225 for C2, to step 100 for C1's control row
    flow = fake_run([.5, .55, .6, .62, .64, .65, .66, .67, .68, .69], every=25)   # steps 0..225
    dense, train4 = fake_run([.5, .6, .64, .66, .67], every=25), fake_run([.5, .58, .62, .63, .65], every=25)
    sec = TaskSection('geneval', 'few', arms={}, base={}, comparisons=[],
                      per_seed={'0': dict(flow_grpo=flow, dense=dense, flow_grpo_train4=train4)})
    pre = load_prereg(p)
    by = {k.id: k for k in pre.claims}
    assert claim_diffs(sec, by['C2']) == [pytest.approx(last_mean(dense.curve, 2) - (.68 + .69) / 2)]
    assert by['C2'].read == 'flow_grpo to step 225'
    three = load_prereg(p).claims + [dataclasses.replace(by['C1'], id='C3', arm='flow_grpo_train4', other='flow_grpo')]
    assert claim_diffs(sec, three[-1]) == [pytest.approx((.63 + .65) / 2 - (.62 + .64) / 2)], \
        'Flow-GRPO read to step 100'
    assert [r.read for r in judge({'geneval': sec}, three)] == ['flow_grpo_train4 to step 100', 'flow_grpo to step 225',
                                                                   'flow_grpo to step 100']

def test_equal_compute_reads_both_runs_at_what_the_cheaper_spent(tmp_path):
    "A post hoc row reads both curves, interpolated, at the smaller of the two runs' total CPU seconds (or NFE)."
    from flowgrpo_nb.study.design import equal_compute, CONTRASTS
    from flowgrpo_nb.study.summary import claim_diffs, curve_at
    from flowgrpo_nb.study.results import fake_run, TaskSection
    flow, dense = (fake_run([.5, .55, .6, .62, .64], every=25, cpu=2.0),
                   fake_run([.5, .6, .64, .66, .67], every=25, cpu=5.0))
    sec = TaskSection('geneval', 'few', arms={}, base={}, comparisons=[],
                      per_seed={'0': dict(flow_grpo=flow, dense=dense)})
    d1 = next(c for c in equal_compute(CONTRASTS) if c.id == 'D1@cpu')
    t = min(flow.total_cpu_seconds, dense.total_cpu_seconds)
    assert t == flow.total_cpu_seconds and 0 < t < dense.total_cpu_seconds
    assert claim_diffs(sec, d1) == [pytest.approx(curve_at(dense.curve, t, 'seconds') - flow.curve[-1].eval)]

def test_confirm_equal_compute_equals_a_hand_recomputation():
    """D1@cpu and D1@nfe in results/confirm/report.json, recomputed by hand from two seeds' run files with numpy alone:
    each run's cumulative process CPU seconds (calibration + the sum of `cpu_step`) and NFE (calibration + (rollout +
    lookahead NFE per sample) x the batch) at every evaluation, both runs read, linearly interpolated, at the smaller of
    their two totals; the seed's difference is DenseGRPO's score there minus Flow-GRPO's."""
    import json, numpy as np
    R = Path(__file__).resolve().parent.parent/'results'/'confirm'
    rep = json.loads((R/'report.json').read_text())
    seeds = rep['setup']['tasks']['geneval'].get('seeds', rep['setup']['seeds'])

    def curve(seed, arm):
        run = R/'runs'/'geneval'/f'seed{seed}'/arm
        rows = [json.loads(l) for l in (run/'metrics.jsonl').read_text().splitlines() if l.strip()]
        cfg, summ = (json.loads((run/f).read_text()) for f in ('config.json', 'summary.json'))
        cal = summ.get('calibration_cost') or dict(cpu_seconds=0.0, nfe=0)
        base = json.loads((R/'runs'/'base'/'mini-geneval'/f'seed{seed}.json').read_text())['overall']
        cpu = cal['cpu_seconds'] + np.cumsum([r['cpu_step'] for r in rows])
        nfe = cal['nfe'] + np.cumsum([(r['nfe_rollout'] + r['nfe_lookahead']) * cfg['prompts_per_step']
                                      * cfg['group_size'] for r in rows])
        ev = [i for i, r in enumerate(rows) if 'eval_overall' in r]
        pts = dict(cpu=[cal['cpu_seconds'], *cpu[ev]], nfe=[cal['nfe'], *nfe[ev]])
        return pts, [base, *(rows[i]['eval_overall'] for i in ev)], dict(cpu=cpu[-1], nfe=nfe[-1])

    for unit in ('cpu', 'nfe'):
        c = next(c for c in rep['contrasts'] if c['id'] == f'D1@{unit}')
        for i, s in enumerate(seeds[:2]):
            (xd, yd, td), (xf, yf, tf) = curve(s, 'dense'), curve(s, 'flow_grpo')
            t = min(td[unit], tf[unit])
            assert c['diffs'][i] == pytest.approx(np.interp(t, xd[unit], yd) - np.interp(t, xf[unit], yf), abs=1e-9), \
                (unit, s)
