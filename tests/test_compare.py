"Checks of flowgrpo_nb.compare's Task seam (the notebook nbs/06b_compare.ipynb runs the embedded default)."
import json

import pytest, torch

from flowgrpo_nb.compare import CompareConfig, FINAL_SEED, compare, final_eval, heldout
from flowgrpo_nb.task import Task, EvalReport, evaluate_policy, load_policy, reward_report

torch.set_num_threads(1)

def brightness(images, prompts): return images.mean((1, 2, 3))

@pytest.fixture(scope='module')
def task():
    "A task of the compare's own making: no categories, no learned score, a continuous reward."
    return Task('brightness', ['a red circle', 'two squares'], ['a blue cross', 'three circles'], brightness,
                lambda images, prompts: reward_report(brightness(images, prompts), prompts))

def test_compare_runs_a_given_task_and_policy(task, tmp_path):
    policy = load_policy('tiny')
    before = {k: v.clone() for k, v in policy.module.state_dict().items()}
    report = compare(tmp_path, CompareConfig(budget='smoke', methods=('flow_grpo', 'dense')), task=task, policy=policy,
                     progress=False)
    after = policy.module.state_dict()  # every training got its own copy: the given policy is untouched
    assert set(after) == set(before) and all(torch.equal(after[k], v) for k, v in before.items())
    base = evaluate_policy(policy, task, 48, seed=FINAL_SEED)
    assert report['base'] == dict(overall=dict(strict=base.overall, se=base.overall_se, n=48), learned_score=None)
    for m in ('flow_grpo', 'dense'):
        r = report['methods'][m]
        assert r['per_category'] == {} and r['learned_score'] is None and r['heldout_strict']['n'] == 1
        ev = json.loads((tmp_path/'seed0'/m/'final_eval.json').read_text())
        assert (ev['task'], ev['n'], ev['seed']) == ('brightness', 48, FINAL_SEED)
        assert report['per_seed']['0'][m]['heldout']['overall']['strict'] == ev['overall']
    assert json.loads((tmp_path/'seed0'/'dense'/'config.json').read_text())['method'] == 'dense'
    assert (tmp_path/'report.html').exists() and len(report['findings']) == 3

def test_final_eval_cache(task, tmp_path):
    policy, path = load_policy('tiny'), tmp_path/'eval.json'
    a = final_eval(policy, task, 12, path)
    d = json.loads(path.read_text())
    d['overall'] = -1.0; path.write_text(json.dumps(d))  # a marker: a reused cache returns it
    assert final_eval(policy, task, 12, path).overall == -1.0
    assert final_eval(policy, task, 6, path).n == 6       # another number of images: evaluated again
    other = Task('other', task.train_prompts, task.eval_prompts, task.reward, task.evaluate)
    assert final_eval(policy, other, 6, path).overall != -1.0 and json.loads(path.read_text())['task'] == 'other'
    assert isinstance(a, EvalReport) and a.n == 12

def test_heldout_keeps_category_fields():
    rep = EvalReport(0.5, 0.1, 4, dict(a=dict(score=1.0, se=0.0, n=2, partial=1.0), b=dict(score=0.0, se=0.0, n=2)),
                     dict(partial=0.75, score=0.3))
    assert heldout(rep) == dict(a=dict(strict=1.0, se=0.0, n=2, partial=1.0), b=dict(strict=0.0, se=0.0, n=2),
                                overall=dict(strict=0.5, se=0.1, n=4, partial=0.75))

def test_compare_needs_an_evaluation(task, tmp_path):
    no_eval = Task('no-eval', task.train_prompts, task.eval_prompts, brightness)
    with pytest.raises(ValueError, match="task 'no-eval' has no evaluation"):
        compare(tmp_path/'out', CompareConfig(budget='smoke'), task=no_eval, progress=False)
    assert not (tmp_path/'out').exists()  # nothing written, nothing trained
