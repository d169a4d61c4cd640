"Checks of flowgrpo_nb.compare: its Task seam, its worker processes, its timings (the notebook nbs/06b_compare.ipynb runs the embedded default)."
import json, os

import pytest, torch
from safetensors.torch import load_file

from flowgrpo_nb.compare import CompareConfig, FINAL_SEED, build_report, compare, final_eval, heldout
from flowgrpo_nb.task import Task, EvalReport, evaluate_policy, load_policy, reward_report

torch.set_num_threads(1)

# module-level functions, so that the task can be sent to compare's worker processes
def brightness(images, prompts): return images.mean((1, 2, 3))
def brightness_report(images, prompts): return reward_report(brightness(images, prompts), prompts)
def failing_reward(images, prompts): raise ValueError('this reward always fails')
def dying_reward(images, prompts): os._exit(3)

def brightness_task(name='brightness', reward=brightness):
    return Task(name, ['a red circle', 'two squares'], ['a blue cross', 'three circles'], reward, brightness_report)

@pytest.fixture(scope='module')
def task():
    "A task of the compare's own making: no categories, no learned score, a continuous reward."
    return brightness_task()

def test_compare_runs_a_given_task_and_policy(task, tmp_path):
    policy = load_policy('tiny')
    before = {k: v.clone() for k, v in policy.module.state_dict().items()}
    report = compare(tmp_path, CompareConfig(budget='smoke', methods=('flow_grpo', 'dense')), task=task, policy=policy,
                     progress=False, workers=2)  # the given task and policy travel to the workers
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

def _tensors(run_dir):
    "Every tensor of a run's checkpoints: {(checkpoint, file, name): tensor}."
    return {(c.name, f.name, k): v for c in sorted((run_dir/'checkpoints').iterdir()) for f in sorted(c.glob('*.safetensors'))
            for k, v in load_file(f).items()}

def test_serial_and_parallel_runs_are_the_same(tmp_path):
    "The default task and model: 2 workers x 1 thread give bitwise what one process with 1 thread gives."
    ccfg = CompareConfig(budget='smoke', methods=('flow_grpo', 'dense'))
    one = compare(tmp_path/'w1', ccfg, progress=False, workers=1, threads=1)
    two = compare(tmp_path/'w2', ccfg, progress=False, workers=2, threads=1)
    assert (one['timing']['workers'], two['timing']['workers'], two['timing']['threads_per_worker']) == (1, 2, 1)
    assert one['base'] == two['base']
    for m in ccfg.methods:
        a, b = one['per_seed']['0'][m], two['per_seed']['0'][m]
        assert a['heldout'] == b['heldout'] and a['learned_score'] == b['learned_score']
        assert [p['eval'] for p in a['curve']] == [p['eval'] for p in b['curve']]
        assert [p['reward'] for p in a['reward_curve']] == [p['reward'] for p in b['reward_curve']]
        ta, tb = _tensors(tmp_path/'w1'/'seed0'/m), _tensors(tmp_path/'w2'/'seed0'/m)
        assert ta and ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta), m
    assert one['methods']['dense']['heldout_strict'] == two['methods']['dense']['heldout_strict']

@pytest.mark.parametrize('reward, why', [(failing_reward, 'ValueError: this reward always fails'), (dying_reward, 'BrokenProcessPool')])
def test_a_failing_worker_names_its_run(tmp_path, reward, why):
    "A run that raises, or a worker process that dies, ends the comparison with one ValueError naming a (seed, method)."
    with pytest.raises(ValueError, match=r"^the run of seed 0, method '(flow_grpo|dense)' failed in its worker process \(") as e:
        compare(tmp_path, CompareConfig(budget='smoke', methods=('flow_grpo', 'dense')), task=brightness_task(reward=reward),
                policy=load_policy('tiny'), progress=False, workers=2)
    assert why in str(e.value) and '\n' not in str(e.value)

def test_workers_need_a_picklable_task(task, tmp_path):
    local = Task('local', task.train_prompts, task.eval_prompts, lambda im, p: brightness(im, p), brightness_report)
    with pytest.raises(ValueError, match="workers=2: the given task or policy cannot be sent to worker processes"):
        compare(tmp_path/'out', CompareConfig(budget='smoke'), task=local, progress=False, workers=2)
    with pytest.raises(ValueError, match="workers=-1"):
        compare(tmp_path/'out', CompareConfig(budget='smoke'), task=task, progress=False, workers=-1)
    assert not (tmp_path/'out').exists()

def _fake_run(d, method, wall, cpu, nfe):
    "A run folder with two steps of the given wall / CPU seconds per step and NFE per sample."
    d.mkdir(parents=True)
    (d/'config.json').write_text(json.dumps(dict(prompts_per_step=2, group_size=4, method=method)))
    steps = [dict(step=i + 1, sec_total=(i + 1) * wall, reward=0.5, nfe_rollout=nfe, nfe_lookahead=0.0,
                  **{f'{k}_{p}': v for k, v in (('sec', wall), ('cpu', cpu)) for p in ('rollout', 'values', 'credit', 'update', 'step')})
             for i in range(2)]
    (d/'metrics.jsonl').write_text('\n'.join(json.dumps(m) for m in steps))
    return dict(dir=d, final=EvalReport(0.5, 0.1, 4))

def test_step_time_ratio_is_cpu_time(tmp_path):
    "A method whose wall time was inflated by a busy machine: the ratio follows the CPU seconds, the wall ratio is kept beside it."
    runs = {(0, 'flow_grpo'): _fake_run(tmp_path/'f', 'flow_grpo', wall=1.0, cpu=1.0, nfe=4),
            (0, 'dense'): _fake_run(tmp_path/'d', 'dense', wall=20.0, cpu=2.0, nfe=12)}
    r = build_report(CompareConfig(budget='smoke', methods=('flow_grpo', 'dense')), EvalReport(0.4, 0.1, 4), runs)
    d = r['methods']['dense']
    assert (d['step_time_ratio']['median'], d['wall_time_ratio']['median'], d['nfe_ratio']['median']) == (2.0, 20.0, 3.0)
    assert d['cpu_seconds_per_step']['step']['mean'] == 2.0 and d['seconds_per_step']['step']['mean'] == 20.0
    assert "costs 2.00× Flow-GRPO's in process CPU seconds (wall seconds 20.00×, NFE 3.00×)" in r['findings'][-1]
