"""Issue 58: an answer that says what the data says. The credit study's answer and table carry every reading of its
contrasts (equal optimizer steps, CPU seconds, NFE), registered or post hoc said; its post hoc rows are what the run
files give by hand; a margin as large as the training gain is said to be uninformative."""
import dataclasses, json
from pathlib import Path

import numpy as np
import pytest

from flowgrpo_nb.study.design import Claim, equal_compute, load_prereg
from flowgrpo_nb.study.document import question_answer, question_table, reading_words, answer_lines
from flowgrpo_nb.study.results import ContrastResult, Report

ROOT = Path(__file__).resolve().parent.parent
R = ROOT/'results'/'credit'
eff = lambda c: f"{c.mean:+.3f} [{c.ci[0]:+.3f}, {c.ci[1]:+.3f}]"

@pytest.fixture(scope='module')
def credit() -> Report: return Report.from_json(json.loads((R/'report.json').read_text()))

def test_equal_compute_adds_every_reading_a_registration_fixed_by_step_counts_lacks():
    "C2 reads Flow-GRPO to step 225 (equal CPU by step counts): the post hoc rows read it at equal steps, CPU and NFE."
    pre = load_prereg(ROOT/'design'/'credit_prereg.toml')
    post = {c.id: c for c in equal_compute(pre.claims, steps=100)}
    assert set(post) == {'C1@cpu', 'C1@nfe', 'C2@steps', 'C2@cpu', 'C2@nfe', 'C3@cpu', 'C3@nfe', 'C4@cpu', 'C4@nfe'}
    assert (post['C2@steps'].other_steps, post['C2@steps'].metric, post['C2@steps'].k) == (100, 'last_mean', 2)
    assert post['C2@cpu'].equal == 'seconds' and post['C2@cpu'].other_steps is None  # the whole 225-step curve
    assert {c.family for c in post.values()} == {'post hoc'}
    # without a study's steps, no equal-steps row; a claim read at both ends (the confirmatory study's) gets none
    assert 'C2@steps' not in {c.id for c in equal_compute(pre.claims)}
    d1 = Claim('D1', 'Does it end higher?', 'dense', 'flow_grpo', 'geneval', 'level', 'last_mean', 'superiority', 0.02,
               k=2)
    assert [c.id for c in equal_compute([d1], steps=100)] == ['D1@cpu', 'D1@nfe']

def test_credit_answer_states_each_reading_of_the_credit_question(credit):
    "The README's sentence, built from the report: C1 at equal steps (registered), at equal CPU and NFE (post hoc)."
    said, cs = question_answer(credit), {c.id: c for c in credit.contrasts}
    assert f"at equal optimizer steps {eff(cs['C1'])}" in said and '(C1, registered)' in said
    assert f"at equal CPU seconds {eff(cs['C1@cpu'])}, below 0 (post hoc)" in said
    assert f"at equal NFE {eff(cs['C1@nfe'])}, below 0 (post hoc)" in said
    # C2 holds above 0 but its effect is below the registered margin, and the sentence says so
    assert cs['C2'].verdict == 'holds' and cs['C2'].mean < cs['C2'].margin
    assert f"{eff(cs['C2'])}, **above 0** but below the registered 0.03 margin (C2, registered)" in said
    # and the same contrast at the readings it was not registered at: equal steps and equal NFE (post hoc)
    assert f"at equal optimizer steps {eff(cs['C2@steps'])}, above 0 (post hoc)" in said
    assert f"at equal NFE {eff(cs['C2@nfe'])}, below 0 (post hoc)" in said
    assert 'at equal optimizer steps only; for the same CPU seconds and NFE' in said
    assert said in (ROOT/'README.md').read_text()  # the README's study answer is this sentence

def test_credit_table_gives_every_reading_of_every_contrast(credit):
    rows = question_table(credit).splitlines()[2:]
    assert len(rows) == 4 and all(r.count('(post hoc)') + r.count('registered)') == 3 for r in rows), rows
    cs = {c.id: c for c in credit.contrasts}
    assert f"| {eff(cs['C2@steps'])}, above 0 (post hoc) | {eff(cs['C2'])}" in rows[1]
    assert f"{eff(cs['C3@cpu'])}, above 0 (post hoc)" in rows[2]  # the window control at equal compute
    learned = rows[3]  # C4, C5: a band of +-0.02 is most of Flow-GRPO's learned-score gain
    assert learned.count('uninformative') == 2 and "of flow_grpo's training gain" in learned
    assert all(cs[i].gain > cs[i].margin / 2 for i in ('C4', 'C5'))

def test_headline_lines_read_every_post_hoc_row(credit):
    c2 = next(l for l in answer_lines(credit) if l.startswith('C2 — '))
    assert c2.index('at equal optimizer steps:') < c2.index('at equal CPU seconds:') < c2.index('at equal NFE:')

def test_reading_words_says_a_band_as_large_as_the_gain_is_uninformative():
    c = ContrastResult('C4', '', 'dense', 'flow_grpo', 'score', 'last_mean2 of the learned score', 'superiority', 0.02,
                       n=6, mean=0.001, ci=[-0.006, 0.008], verdict='equivalent', family='secondary', gain=0.022)
    assert reading_words(c).endswith("uninformative: ±0.02 is 91% of flow_grpo's training gain (+0.022) (C4, "
                                     "registered)")
    assert 'uninformative' not in reading_words(dataclasses.replace(c, gain=0.1))
    assert reading_words(dataclasses.replace(c, family='post hoc')) == '+0.001 [-0.006, +0.008], 0 inside it (post hoc)'

def _curve(seed:int, arm:str, task:str='geneval'):
    "One credit run's held-out strict curve against cumulative CPU seconds and NFE, by hand from its run files."
    run = R/'runs'/task/f'seed{seed}'/arm
    rows = [json.loads(l) for l in (run/'metrics.jsonl').read_text().splitlines() if l.strip()]
    cfg, summ = (json.loads((run/f).read_text()) for f in ('config.json', 'summary.json'))
    cal = summ.get('calibration_cost') or dict(cpu_seconds=0.0, nfe=0)
    base = json.loads((R/'runs'/'base'/'mini-geneval'/f'seed{seed}.json').read_text())['overall']
    cpu = cal['cpu_seconds'] + np.cumsum([r['cpu_step'] for r in rows])
    nfe = cal['nfe'] + np.cumsum([(r['nfe_rollout'] + r['nfe_lookahead']) * cfg['prompts_per_step']
                                  * cfg['group_size'] for r in rows])
    ev = [i for i, r in enumerate(rows) if 'eval_overall' in r]
    return (dict(cpu=[cal['cpu_seconds'], *cpu[ev]], nfe=[cal['nfe'], *nfe[ev]]),
            [base, *(rows[i]['eval_overall'] for i in ev)], dict(cpu=cpu[-1], nfe=nfe[-1]))

@pytest.mark.parametrize('id,arm,other', [('C2@nfe', 'dense', 'flow_grpo'), ('C1@cpu', 'dense', 'flow_grpo_train4'),
                                          ('C3@cpu', 'flow_grpo_train4', 'flow_grpo')])
def test_credit_post_hoc_rows_equal_a_hand_recomputation(credit, id, arm, other):
    "Both runs of a seed read, interpolated, at the smaller of their totals (as the confirmatory study's D1@cpu)."
    c, unit = next(c for c in credit.contrasts if c.id == id), id.split('@')[1]
    for i, s in enumerate(credit.setup['tasks']['geneval']['seeds'][:2]):
        (xa, ya, ta), (xo, yo, to) = _curve(s, arm), _curve(s, other)
        t = min(ta[unit], to[unit])
        assert c.diffs[i] == pytest.approx(np.interp(t, xa[unit], ya) - np.interp(t, xo[unit], yo), abs=1e-9), s

def test_prompt_shares_by_hand():
    "Two seeds, categories a (two prompts) and b (one): each prompt's share of the category-balanced effect."
    from flowgrpo_nb.study.summary import prompt_shares
    d, w = np.array([[0.1, 0.3, 0.2], [0.0, 0.2, 0.0]]), np.array([[2, 2, 4], [2, 2, 4]], float)
    sh = prompt_shares(d, w, ['a', 'a', 'b'], ['a1', 'a2', 'b1'])
    # contributions: a1 (0.05 + 0) / 2 / 2, a2 (0.15 + 0.1) / 2 / 2, b1 (0.2 + 0) / 2 / 2; effect 0.125
    assert sh['prompts'] == pytest.approx({'a2': 0.0625 / 0.125, 'b1': 0.05 / 0.125, 'a1': 0.0125 / 0.125})
    assert sh['largest'] == ['a2', pytest.approx(0.5)] and sum(sh['categories'].values()) == pytest.approx(1)

def test_credit_report_carries_both_intervals_and_the_largest_prompt_share(credit):
    "Each strict-score claim: an interval over seeds and held-out prompts beside the seed-only one; C2 rests on one."
    cs = {c.id: c for c in credit.contrasts}
    for c in credit.contrasts:
        if c.task == 'geneval': assert c.ci_prompts and c.prompt_shares and c.ci, c.id
    c2 = cs['C2']
    assert c2.ci_prompts[0] < c2.ci[0] and c2.ci_prompts[1] > c2.ci[1]  # the prompts widen C2's interval
    name, share = c2.prompt_shares['largest']
    assert name == 'a circle and a cross' and share > 0.2 and c2.prompt_shares['categories']['two_object'] > 0.4
    said = next(f for f in credit.findings if f.startswith('[geneval] C2 (primary)'))
    assert f"over seeds and held-out prompts [{c2.ci_prompts[0]:+.3f}, {c2.ci_prompts[1]:+.3f}]" in said
    assert "one prompt carries more than a fifth of it: 'a circle and a cross'" in said
    # the learned score logs no per-prompt results: its claims say their intervals are over seeds only
    assert cs['C4'].ci_prompts is None and any(f.startswith('[score] its runs logged no per-prompt') for f in
                                               credit.findings)

def test_prompt_effects_give_each_seeds_difference_from_the_run_files():
    "The per-prompt decomposition of a claim's reading adds up, per seed, to the claim's paired difference (to 1e-4)."
    import importlib.util
    from flowgrpo_nb.study import compare
    from flowgrpo_nb.study.summary import prompt_effects, claim_diffs
    seen = {}
    real = compare._judged
    def spy(ccfg, sections, setup, fidelity, *rest):
        seen.update(sections=sections, setup=setup); return real(ccfg, sections, setup, fidelity, *rest)
    compare._judged = spy
    try: compare.rebuild_report(R/'runs')
    finally: compare._judged = real
    pre = load_prereg(ROOT/'design'/'credit_prereg.toml')
    names, cats = compare.heldout_prompts(seen['setup'], 'geneval')
    strata = np.array(cats)
    for c in [*pre.claims[:3], *equal_compute(pre.claims[:3], 100)]:
        sec = seen['sections']['geneval']
        d, w = prompt_effects(sec, c)
        per_seed = np.mean([(w * d)[:, strata == k].sum(1) / w[:, strata == k].sum(1) for k in set(cats)], 0)
        assert per_seed == pytest.approx(claim_diffs(sec, c), abs=1e-4), c.id

def test_main_job_check_fails_for_a_planted_trainer_that_does_not_learn():
    "The main job's runs with every evaluation at the base model's score: never 'training works here'."
    from flowgrpo_nb.study.reference import reference_sentence, placement
    read = lambda n: Report.from_json(json.loads((ROOT/'results'/n/'report.json').read_text()))
    main, ref = read('main'), read('confirm')
    flat = Report.from_json(json.loads(json.dumps(main.to_json())))
    for runs in flat.tasks['geneval'].per_seed.values():
        for r in runs.values(): r.curve = [dataclasses.replace(p, eval=r.curve[0].eval) for p in r.curve]
    said = reference_sentence(flat, ref)
    assert 'training works here as it did there' not in said, said
    assert 'does not show that training works' in said or 'do not learn as the study' in said
    # the committed job (50 steps) is inside bands that still hold the untrained model: it does not claim learning
    assert 'training works here as it did there' not in reference_sentence(main, ref)
    assert any(p['rows'][-1]['holds_base'] for p in placement(main, ref).values())  # Flow-GRPO's at step 50

def test_no_claim_is_judged_on_one_degree_of_freedom():
    main = json.loads((ROOT/'results'/'main'/'report.json').read_text())
    assert all(c['n'] == 0 and c.get('seeds_needed') is None for c in main['contrasts'])  # two seeds: no row
    assert all(a.get('se_ratio') is None for a in main['tasks']['geneval']['arms'].values())
