"""Checks of flowgrpo_nb.study.compare that run a whole budget at smoke sizes: the study's arms over three seeds, and
the main job on the confirmatory study's bands (a file of their own beside tests/test_compare.py, so that the two share
the work of the two pytest workers)."""
import dataclasses, json

import torch

from flowgrpo_nb.study.design import STUDY_ARMS, SMOKE, CompareConfig
from flowgrpo_nb.study.compare import compare
from flowgrpo_nb.study.results import Report

torch.set_num_threads(1)

def test_the_study_at_smoke_sizes(tmp_path):
    """The study's arms of the few-level task at smoke sizes over three seeds (a claim needs two degrees of freedom),
    end to end: every arm trains and reports, every claim of that task gets a verdict."""
    ccfg = CompareConfig('study', seeds=(0, 1, 2), tasks=('geneval',), overrides=SMOKE)
    STUDY = STUDY_ARMS['geneval']  # every arm but those added after the study ran
    report = compare(tmp_path, ccfg, progress=False, png=False)
    sec = report.tasks['geneval']
    assert set(sec.arms) == set(STUDY) and all(r.heldout_strict.n == 3 and r.auc is not None for r in sec.arms.values())
    # every control is either measured against the arm's gradient or says why not
    for c in (c for c in sec.comparisons if c.is_control):
        assert 0 <= (c.window_share if c.window_share is not None else -1) <= 1 + 1e-9 or c.window_unchecked, c
    claims = {c.id: c for c in report.contrasts}
    assert all(c.n == 3 and c.verdict != 'not run' for c in claims.values() if c.task == 'geneval')
    assert all(c.verdict == 'not run' for c in claims.values() if c.task == 'score')
    assert report.timing['runs'] == len(STUDY) * 3 and report.timing['runs_reused'] == 0
    # every point of a curve keeps its per-category scores: the report draws them over steps
    run = sec.per_seed['0']['flow_grpo']
    assert (all(set(p.categories) == set(run.heldout) - {'overall'} for p in run.curve)
            and run.curve[-1].categories['counting'] == run.heldout['counting']['strict'])
    assert 'held-out strict score per category vs optimizer steps' in (tmp_path/'report.html').read_text()
    assert Report.from_json(json.loads((tmp_path/'report.json').read_text())).contrasts == report.contrasts
    # item 5: each arm's credit fidelity on its own fine-tuned runs, put in the rebuilt report (runs reused, nothing
    # retrained)
    from flowgrpo_nb.study.fidelity import FidelityConfig
    from flowgrpo_nb.study.fidelity_report import compare_fidelity
    rows = compare_fidelity(tmp_path, None, FidelityConfig(prompts=4, batch_prompts=4, group=4, M=2, n_boot=20),
                            seeds=(0,), progress=False)
    assert sorted(r['arm'] for r in rows) == sorted(STUDY) and all(r['seed'] == 0 for r in rows)
    again = compare(tmp_path, dataclasses.replace(ccfg, fidelity=str(tmp_path/'fidelity'/'fidelity.json')),
                    progress=False, png=False)
    assert again.timing['runs_reused'] == len(STUDY) * 3
    # an arm whose fidelity row has a Kendall tau (not NaN: at these sizes a batch can hold no true gain to rank)
    # carries it
    finite = {r['arm'] for r in rows if r['kendall'] is not None and r['kendall'] == r['kendall']}
    assert len(finite) >= len(STUDY) // 2, rows
    assert {a: (r.fidelity['seeds'], r.fidelity['kendall'] and r.fidelity['kendall'].n)
            for a, r in again.tasks['geneval'].arms.items()} == \
        {a: ([0], 1 if a in finite else None) for a in STUDY}
    assert any(f.startswith('[geneval] credit fidelity of the fine-tuned runs') for f in again.findings)
    assert 'credit fidelity (Kendall tau-b) against training gain' in (tmp_path/'report.html').read_text()

def test_the_main_job_opens_on_the_study_bands(tmp_path):
    """The main job (budget default at smoke sizes, evaluated at step 25 as the confirmatory study was) opens its report
    on its curves drawn on the study's bands, with the sentence and, once, what two seeds decide: no verdict per
    comparison."""
    report = compare(tmp_path, CompareConfig(overrides=SMOKE | dict(steps=25, eval_every=25)), progress=False,
                     png=False)
    first, decides = report.findings[:2]
    assert (first.startswith("[geneval] This job's mean of 2 seeds against the confirmatory study's (14 seeds")
            and 'at step 25, Flow-GRPO ' in first)
    assert (decides.startswith('[geneval] What this job decides: with 2 seeds per arm and 25 steps')
            and "over the study's 14 seeds" in decides)
    assert not any('not distinguishable' in f for f in report.findings)
    page = (tmp_path/'report.html').read_text()
    head = page[:page.index('<h2>Setup')]
    assert ("id=\"headline\"" in head and 'this job, mean of 2 seeds' in head
            and "This job&#x27;s mean of 2 seeds" in head)
    fig = json.loads((tmp_path/'figures'/'geneval_reference.json').read_text())
    assert sum(d.get('fill') == 'toself' for d in fig['data']) == 2   # a band per arm
    short = compare(tmp_path/'s', CompareConfig(overrides=SMOKE | dict(steps=2)), progress=False, png=False)
    assert (short.findings[0].startswith("[geneval] This job's runs are not placed on results/confirm's bands")
            and 'at steps 0, 2 and' in short.findings[0])
