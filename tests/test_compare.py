"""Checks of flowgrpo_nb.study.compare: its Task seam, its worker processes, its statistics and costs (the notebook
nbs/06h_compare.ipynb runs the embedded default)."""
import copy, json, os, signal, tempfile, time
from pathlib import Path

import pytest, torch
import flowgrpo_nb
from fastcore.script import anno_parser
from safetensors.torch import load_file

from flowgrpo_nb.precision import resolve_fast, cpu_name
from flowgrpo_nb.study.design import ARMS, SMOKE, arm_config, arm_settings, CompareConfig
from flowgrpo_nb.study.costs import job_costs, estimate_cost
from flowgrpo_nb.study.compare import EVAL_SEED, compare
from flowgrpo_nb.study.runs import base_eval, _train_one
from flowgrpo_nb.study.job import compare_cli
from flowgrpo_nb.study.results import Report, heldout, run_report
from flowgrpo_nb.study.summary import first_reach
from flowgrpo_nb.study.summary import task_section, correct
from flowgrpo_nb.study.report import findings
from flowgrpo_nb.study.page import results_markdown
from flowgrpo_nb.config import GRPOConfig
from flowgrpo_nb.checkpoint import RunFolder
from flowgrpo_nb.task import Task, EvalReport, evaluate_policy, load_policy, reward_report
from flowgrpo_nb.train import GRPOTrainer

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parent.parent

# module-level functions, so that the task can be sent to compare's worker processes
def brightness(images, prompts): return images.mean((1, 2, 3))
def brightness_report(images, prompts): return reward_report(brightness(images, prompts), prompts)
def failing_reward(images, prompts): raise ValueError('this reward always fails')
def dying_reward(images, prompts): os._exit(3)

SIGTERM_FLAG = Path(tempfile.gettempdir())/'flowgrpo-test-sigterm-reward'  # the worker that ran first, by PID

def sigterm_reward(images, prompts):
    "The first worker to score is stopped by SIGTERM (its PID kept in SIGTERM_FLAG); the others wait to be stopped."
    try: fd = os.open(SIGTERM_FLAG, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError: time.sleep(120); return brightness(images, prompts)
    os.write(fd, str(os.getpid()).encode()); os.close(fd)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(120)

def brightness_task(name='brightness', reward=brightness):
    return Task(name, ['a red circle', 'two squares'], ['a blue cross', 'three circles'], reward, brightness_report)

ONE = dict(budget='smoke', tasks=('geneval',), arms=('flow_grpo', 'dense'))  # one task, two arms: a quick comparison

@pytest.fixture(scope='module')
def task():
    "A task of the compare's own making: no categories, no learned score, a continuous reward."
    return brightness_task()

def test_compare_runs_a_given_task_and_policy(task, tmp_path):
    policy = load_policy('tiny')
    before = {k: v.clone() for k, v in policy.module.state_dict().items()}
    # they travel to the workers
    report = compare(tmp_path, CompareConfig(**ONE), task=task, policy=policy, progress=False, workers=2, png=False)
    after = policy.module.state_dict()  # every training got its own copy: the given policy is untouched
    assert set(after) == set(before) and all(torch.equal(after[k], v) for k, v in before.items())
    sec = report.tasks['geneval']
    cfg = CompareConfig(**ONE).train_config('flow_grpo', 0)  # the trainer's evaluation settings and noise of seed 0
    base = evaluate_policy(copy.deepcopy(policy).set_fast(resolve_fast(cfg.fast)[0]), task, cfg.eval_images, K=cfg.K,
                           shift=cfg.shift, guidance=cfg.guidance, seed=cfg.seed + EVAL_SEED)
    assert sec.base['per_seed']['0'] == heldout(base) and sec.base['learned_score'] is None
    for m in ('flow_grpo', 'dense'):
        r, run = sec.arms[m], sec.per_seed['0'][m]
        assert r.per_category == {} and r.learned_score is None and r.heldout_strict.n == 1
        last = RunFolder(tmp_path/'geneval'/'seed0'/m).metrics()[-1]
        assert run.heldout['overall']['strict'] == last['eval_overall'] and run.curve[0].eval == base.overall
        # the base point, then the trainer's final evaluation
        assert [p.step for p in run.curve] == [0, 2] and not (tmp_path/'figures'/'geneval_costs.png').exists()
    assert RunFolder(tmp_path/'geneval'/'seed0'/'dense').config()['method'] == 'dense'
    assert not list(tmp_path.rglob('.lock'))  # every writer let go of its folder
    assert report.setup['tasks']['geneval']['name'] == 'brightness'
    assert (tmp_path/'report.html').exists() and report.findings
    # every run reused
    again = compare(tmp_path, CompareConfig(**ONE), task=task, policy=policy, progress=False, workers=1, png=False)
    assert (report.timing['runs_reused'], again.timing['runs_reused'], again.timing['runs']) == (0, 2, 2)
    # the job's own wall time survives a rebuild
    assert [i['runs_trained'] for i in again.timing['invocations']] == [2, 0]
    assert again.timing['invocations'][0]['wall_seconds'] == report.wall_seconds
    inv = again.timing['invocations']  # each with the command and the code that ran it (invocations.jsonl)
    assert ([i['command'] for i in inv] == [again.timing['command']] * 2
            and again.timing['command'].startswith('flowgrpo compare --budget smoke --out .'))  # from its folder
    assert str(tmp_path) not in (tmp_path/'invocations.jsonl').read_text() + (tmp_path/'compare.json').read_text()
    assert (all(i['code']['version'] == flowgrpo_nb.__version__ for i in inv)
            and [i['runs_to_train'] for i in inv] == [2, 0])
    assert all(i['cpu'] == {'cpu': cpu_name(), 'capability': torch.backends.cpu.get_cpu_capability()} for i in inv)
    assert all(i['reproducible'] is False for i in inv)  # the mode, recorded (here: the default)
    assert f"on {cpu_name()} (" in (tmp_path/"report.html").read_text()  # the page says which CPU ran each invocation
    assert again.findings == report.findings and again.tasks['geneval'].base == sec.base

def test_base_eval_is_the_trainers_first_evaluation(task, tmp_path):
    "The base point of a seed is what a run of that seed would have evaluated before its first step (`evaluate_base`)."
    cfg = CompareConfig(budget='smoke').train_config('flow_grpo', 3)
    tr = GRPOTrainer(GRPOConfig.from_dict(cfg.to_dict() | dict(log_with='none')), tmp_path/'run',
                     policy=load_policy('tiny'), task=task, progress=False)
    assert base_eval(load_policy('tiny'), task, cfg).overall == pytest.approx(tr.evaluate().overall, abs=1e-6)

def test_base_eval_cache(task, tmp_path):
    cfg, path = CompareConfig(budget='smoke').train_config('flow_grpo', 0), tmp_path/'eval.json'
    a = base_eval(load_policy('tiny'), task, cfg, path, progress=False)
    d = json.loads(path.read_text())
    d['overall'] = -1.0; path.write_text(json.dumps(d))  # a marker: a reused cache returns it
    assert base_eval(load_policy('tiny'), task, cfg, path).overall == -1.0
    other_weights = load_policy('tiny')
    with torch.no_grad(): next(other_weights.module.parameters()).add_(0.5)  # other base weights: evaluated afresh
    assert base_eval(other_weights, task, cfg, path, progress=False).overall != -1.0
    d['overall'] = -1.0; path.write_text(json.dumps(d))
    other = Task('other', task.train_prompts, task.eval_prompts, task.reward, task.evaluate)
    assert (base_eval(load_policy('tiny'), other, cfg, path).overall != -1.0
            and json.loads(path.read_text())['key']['task'] == 'other')
    assert isinstance(a, EvalReport) and a.n == cfg.eval_images

def test_finished_run_of_other_base_weights_is_not_reused(task, tmp_path):
    "A finished run is reused only when it was trained on the base weights of the given policy."
    from flowgrpo_nb.study.runs import _train_one
    cfg, d = CompareConfig(budget='smoke').train_config('flow_grpo', 0), RunFolder(tmp_path/'run')
    d.write('config', cfg.to_dict()); d.write('summary', dict(steps=cfg.steps))
    policy = load_policy('tiny')
    d.write('base', dict(fingerprint=policy.base_fingerprint()))
    _train_one(cfg, d.path, policy, task, False)  # the same weights: reused, nothing trained
    assert not d.file('metrics').exists()
    # compare checks before any work, loading the config's model when none is given
    from flowgrpo_nb.study.runs import _check_reused, run_dir
    ccfg = CompareConfig(budget='smoke')
    run = RunFolder(run_dir(tmp_path/'out', 'geneval', 0, 'flow_grpo'))
    run.write('base', dict(fingerprint='0' * 16))
    for given in (policy, None):
        with pytest.raises(ValueError, match='other base weights'):
            _check_reused([('geneval', 0, 'flow_grpo')], tmp_path/'out', ccfg, given)
    run.write('base', dict(fingerprint=policy.base_fingerprint()))
    _check_reused([('geneval', 0, 'flow_grpo')], tmp_path/'out', ccfg, None)

def test_heldout_keeps_category_fields():
    rep = EvalReport(0.5, 0.1, 4, dict(a=dict(score=1.0, se=0.0, n=2, partial=1.0), b=dict(score=0.0, se=0.0, n=2)),
                     dict(partial=0.75, score=0.3))
    assert heldout(rep) == dict(a=dict(strict=1.0, se=0.0, n=2, partial=1.0), b=dict(strict=0.0, se=0.0, n=2),
                                overall=dict(strict=0.5, se=0.1, n=4, partial=0.75))

def test_compare_checks_before_it_starts(task, tmp_path):
    no_eval = Task('no-eval', task.train_prompts, task.eval_prompts, brightness)
    with pytest.raises(ValueError, match="task 'no-eval' has no evaluation"):
        compare(tmp_path/'out', CompareConfig(**ONE), task=no_eval, progress=False)
    with pytest.raises(ValueError, match="task: one Task for the 2 tasks"):
        compare(tmp_path/'out', CompareConfig(budget='smoke'), task=task, progress=False)
    with pytest.raises(ValueError, match="must evaluate alike and at all"):
        compare(tmp_path/'out', CompareConfig(**ONE, overrides=dict(eval_images=0)), task=task, progress=False)
    with pytest.raises(ValueError, match="GRPOConfig.lr=-1"):  # every run's config is checked first
        compare(tmp_path/'out', CompareConfig(**ONE, overrides=dict(lr=-1)), task=task, progress=False)
    assert not (tmp_path/'out').exists()  # nothing written, nothing trained

def test_a_second_job_on_the_same_out_is_refused_before_any_work(task, tmp_path, lock_holder):
    """While another process writes --out (a comparison), a job on it is refused at once, naming that process; a run
    folder likewise."""
    child = lock_holder(tmp_path/'out', 'a comparison')
    with pytest.raises(ValueError,
                       match=rf"out is being written by another process \(a comparison, PID {child.pid}, since "):
        compare(tmp_path/'out', CompareConfig(**ONE), task=task, progress=False, workers=1)
    assert [p.name for p in (tmp_path/'out').iterdir()] == ['.lock']  # nothing of the refused job
    run = lock_holder(tmp_path/'run', 'a trainer')
    with pytest.raises(ValueError,
                       match=rf"run is being written by another process \(a trainer, PID {run.pid}, since "):
        _train_one(CompareConfig(**ONE).train_config('flow_grpo', 0), tmp_path/'run', None, task, False)

def test_a_folder_of_other_settings_is_not_reused(task, tmp_path):
    cfg = CompareConfig(**ONE).train_config('flow_grpo', 0)
    RunFolder(tmp_path/'run').write('config', cfg.to_dict() | dict(lr=5e-4))
    with pytest.raises(ValueError, match=r"run holds a run with other settings \(lr: 0.0005 -> 0.001\)"):
        _train_one(cfg, tmp_path/'run', None, task, False)

def _tensors(run_dir):
    "Every tensor of a run's checkpoints: {(checkpoint, file, name): tensor}."
    return {(c.name, f.name, k): v for c in sorted((run_dir/'checkpoints').iterdir())
            for f in sorted(c.glob('*.safetensors'))
            for k, v in load_file(f).items()}

def test_serial_and_parallel_runs_are_the_same(tmp_path):
    "The default tasks and model: 2 workers x 1 thread give bitwise what one process with 1 thread gives."
    ccfg = CompareConfig(budget='smoke', arms=('flow_grpo', 'dense'))
    one = compare(tmp_path/'w1', ccfg, progress=False, workers=1, threads=1, png=False)
    two = compare(tmp_path/'w2', ccfg, progress=False, workers=2, threads=1, png=False)
    assert (one.timing['workers'], two.timing['workers'], two.timing['threads_per_worker']) == (1, 2, 1)
    for t in ('geneval', 'score'):
        a_, b_ = one.tasks[t], two.tasks[t]
        assert a_.base == b_.base and a_.comparisons == b_.comparisons
        for m in ccfg.arms:
            a, b = a_.per_seed['0'][m], b_.per_seed['0'][m]
            assert a.heldout == b.heldout and a.learned_score == b.learned_score
            assert [p.eval for p in a.curve] == [p.eval for p in b.curve]
            assert [p['reward'] for p in a.reward_curve] == [p['reward'] for p in b.reward_curve]
            ta, tb = _tensors(tmp_path/'w1'/t/'seed0'/m), _tensors(tmp_path/'w2'/t/'seed0'/m)
            assert ta and ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta), (t, m)
    assert one.tasks['score'].arms['dense'].heldout_strict == two.tasks['score'].arms['dense'].heldout_strict

@pytest.mark.parametrize('reward, why',
                         [(failing_reward, 'this reward always fails'), (dying_reward, 'died: exit status 3')])
def test_a_failing_worker_names_its_run(tmp_path, reward, why):
    """A run that raises, or a worker process that dies, ends the comparison with one ValueError naming a (seed, arm) or
    the base evaluation."""
    with pytest.raises(ValueError, match=r"^the (run of seed 0, arm '(flow_grpo|dense)' \(task 'geneval'\)"
                                         r"|base model's evaluation \(geneval, seed 0\)) "
                                         r"failed in its worker process \(") as e:
        compare(tmp_path, CompareConfig(**ONE), task=brightness_task(reward=reward), policy=load_policy('tiny'),
                progress=False, workers=2)
    assert why in str(e.value) and '\n' not in str(e.value)

def test_a_killed_worker_is_reported_as_the_run_it_was_running(tmp_path):
    """SIGTERM to the worker running one job: the sentence names that job and its process, not the job whose future
    the broken pool failed first (the pool stops the other workers with SIGTERM too)."""
    SIGTERM_FLAG.unlink(missing_ok=True)
    try:
        with pytest.raises(ValueError, match=r"^the (run of seed 0, arm '(flow_grpo|dense)' \(task 'geneval'\)"
                                             r"|base model's evaluation \(geneval, seed 0\)) failed in its") as e:
            compare(tmp_path, CompareConfig(**ONE), task=brightness_task(reward=sigterm_reward),
                    policy=load_policy('tiny'), progress=False, workers=2)
        pid = int(SIGTERM_FLAG.read_text())
    finally: SIGTERM_FLAG.unlink(missing_ok=True)
    assert f"(its process (PID {pid}) died: killed by SIGTERM)" in str(e.value), str(e.value)

def test_workers_need_a_picklable_task(task, tmp_path):
    local = Task('local', task.train_prompts, task.eval_prompts, lambda im, p: brightness(im, p), brightness_report)
    with pytest.raises(ValueError, match="workers=2: the given task or policy cannot be sent to worker processes"):
        compare(tmp_path/'out', CompareConfig(**ONE), task=local, progress=False, workers=2)
    with pytest.raises(ValueError, match="workers=-1"):
        compare(tmp_path/'out', CompareConfig(**ONE), task=task, progress=False, workers=-1)
    assert not (tmp_path/'out').exists()

def _fake_run(d, method, wall, cpu, nfe, final=0.5, steps=2, calibration=None, turning_points=None, score=None):
    "A run folder with `steps` steps of the given wall / CPU seconds and NFE per sample, and a final evaluation."
    run = RunFolder(d)
    run.write('config', dict(prompts_per_step=2, group_size=4, minibatch=8, updates_per_rollout=1, method=method,
                             eval_images=4))
    run.write('summary', dict(steps=steps, calibration_cost=calibration))
    ms = [dict(step=i + 1, sec_total=(i + 1) * wall, reward=0.5, nfe_rollout=nfe, nfe_lookahead=0.0,
               **({} if turning_points is None else dict(turning_points=turning_points)),
               **{f'{k}_{p}': v for k, v in (('sec', wall), ('cpu', cpu))
                  for p in ('rollout', 'values', 'credit', 'update', 'step')})
          for i in range(steps)]
    ms[-1] |= dict(eval_overall=final, eval_overall_se=0.1, **({} if score is None else dict(eval_score=score)))
    for m in ms: run.log.append(m)
    return d

def _report(runs:dict, levels='few', finals=None):
    "A one-task, one-seed report of fake run folders {arm: folder}."
    base = EvalReport(0.4, 0.1, 4)
    per_seed = {'0': {a: run_report(d, base) for a, d in runs.items()}}
    sec = task_section('geneval', per_seed, {'0': (heldout(base), None)}, list(runs), levels)
    arms = {a: arm_settings(a, arm_config(a), levels) | dict(controls=dict(geneval=ARMS[a].control_for(levels)))
            for a in runs}
    correct(dict(geneval=sec))
    rep = Report(format=3, setup=dict(arms=arms), tasks=dict(geneval=sec), findings=[])
    rep.findings = findings(rep)
    return rep

def test_step_time_ratio_is_cpu_time_and_calibration_counts(tmp_path):
    """A run whose wall time was inflated by a busy machine: the ratio follows the CPU seconds; calibration adds to the
    run's NFE and seconds."""
    cal = dict(nfe=1000, rollouts=16, seconds=5.0, cpu_seconds=4.0)
    r = _report({'flow_grpo': _fake_run(tmp_path/'f', 'flow_grpo', wall=1.0, cpu=1.0, nfe=4),
                 'dense': _fake_run(tmp_path/'d', 'dense', wall=20.0, cpu=2.0, nfe=12, calibration=cal)})
    d, run = r.tasks['geneval'].arms['dense'], r.tasks['geneval'].per_seed['0']['dense']
    assert (d.step_time_ratio.median, d.wall_time_ratio.median, d.nfe_ratio.median) == (2.0, 20.0, 3.0)
    assert d.cpu_seconds_per_step['step'].mean == 2.0 and d.seconds_per_step['step'].mean == 20.0
    assert run.total_nfe == 2 * 12 * 8 + 1000 and run.total_cpu_seconds == 4.0 + 2 * 2.0
    assert [p.seconds for p in run.curve] == [4.0, 8.0]  # the seconds axis starts with the calibration
    assert [p.nfe for p in run.curve] == [1000, 1000 + 2 * 12 * 8]  # and so does the NFE axis
    assert d.cost_ratio.mean == 8.0 / 2.0
    assert any("a step costs 2.00× Flow-GRPO's CPU seconds (wall 20.00×), 96 NFE (3.00×); calibration "
               "1000 NFE and 4 CPU s; the whole run 4.00× Flow-GRPO's CPU seconds." in f for f in r.findings)

@pytest.mark.parametrize('fired', [0.0, 3.0])
def test_turning_points_that_never_fire_are_said(tmp_path, fired):
    r = _report({'flow_grpo': _fake_run(tmp_path/'f', 'flow_grpo', 1.0, 1.0, 4),
                 'turning_point': _fake_run(tmp_path/'t', 'turning_point', 2.0, 2.0, 12, turning_points=fired)})
    said = [f for f in r.findings if 'fired no turning point' in f]
    assert (len(said), r.tasks['geneval'].arms['turning_point'].turning_points) == \
        ((1, 0.0) if fired == 0 else (0, 6.0))
    assert any("turning_point's window-matched control flow_grpo_train4 did not run" in f for f in r.findings)

def test_dense_credit_that_does_not_beat_its_control_is_said(tmp_path):
    r = _report({'flow_grpo': _fake_run(tmp_path/'f', 'flow_grpo', 1.0, 1.0, 4, final=0.50),
                 'flow_grpo_train4': _fake_run(tmp_path/'e', 'flow_grpo', 1.0, 1.0, 4, final=0.60),
                 'dense': _fake_run(tmp_path/'d', 'dense', 2.0, 2.0, 12, final=0.61)})
    f = next(f for f in r.findings
             if f.startswith('[geneval] dense vs flow_grpo_train4 (its window-matched control by its preset, '
                             'unchecked: the runs logged no gradient shares)'))
    assert 'not distinguishable' in f and 'does not beat' in f
    assert r.findings.index(f) < next(i for i, f in enumerate(r.findings)
                                      if f.startswith('[geneval] dense vs flow_grpo: +0.110'))

def test_learned_score_is_compared_with_seeds(tmp_path):
    """The score task is judged on strict mini-GenEval and on the learned score it trains; the latter, logged without
    SEs, needs seeds."""
    base = EvalReport(0.4, 0.1, 4, extra=dict(score=0.5))
    per_seed = {str(s): {a: run_report(_fake_run(tmp_path/f'{a}{s}', a, 1.0, 1.0, 4, score=sc), base)
                         for a, sc in (('flow_grpo', 0.6 + s / 100), ('dense', 0.7 + s / 50))} for s in range(3)}
    sec = lambda n: task_section('score', dict(list(per_seed.items())[:n]),
                                 {str(s): (heldout(base), 0.5) for s in range(n)}, ['flow_grpo', 'dense'], 'continuous',
                                 ('strict', 'learned_score'))
    c = [c for c in sec(3).comparisons if c.metric == 'learned_score' and c.arm == 'dense' and c.other == 'flow_grpo']
    assert (len(c) == 1 and c[0].is_control and c[0].verdict == 'higher'
            and c[0].diffs == pytest.approx([0.1, 0.11, 0.12]))
    assert {c.metric for c in sec(1).comparisons} == {'strict'}

def test_readme_results_and_an_older_report_format(tmp_path):
    """A report of this format renders; one of the one-task format before it is refused with the command that rebuilds
    it."""
    with pytest.raises(ValueError, match=r"report format 1 .*flowgrpo compare --out DIR"):
        Report.from_json(dict(budget={}, per_seed={}, methods={}, findings=[]))
    r = _report({'flow_grpo': _fake_run(tmp_path/'f', 'flow_grpo', 1.0, 1.0, 4),
                 'dense': _fake_run(tmp_path/'d', 'dense', 2.0, 2.0, 12)})
    r.setup |= dict(budget='smoke', steps=2, prompts_per_step=2, group_size=4, seeds=[0], evaluation=dict(images=4),
                    tasks=dict(geneval=dict(about='a test', arms=['flow_grpo', 'dense'])))
    md = results_markdown(r)
    assert (md.startswith('`flowgrpo compare --budget smoke`') and '| arm | held-out strict' in md
            and r.findings[0] in md)
    assert results_markdown(Report.from_json(json.loads(json.dumps(r.to_json())))) == md  # its JSON renders the same

def test_cli(capsys):
    a = anno_parser(compare_cli).parse_args(['--seeds', '0', '1', '--tasks', 'geneval', '--arms', 'flow_grpo', 'dense',
                                             '--set', 'lr=1e-3', '--estimate'])
    assert (a.seeds, a.tasks, a.arms, a.set, a.estimate) == \
        ([0, 1], ['geneval'], ['flow_grpo', 'dense'], ['lr=1e-3'], True)
    compare_cli.__wrapped__(seeds=[0, 1], tasks=['geneval'], arms=['flow_grpo', 'dense'], set=['lr=1e-3'],
                            estimate=True)
    e = estimate_cost(CompareConfig(seeds=(0, 1), tasks=('geneval',), arms=('flow_grpo', 'dense'),
                                    overrides=dict(lr=1e-3)))
    # the estimate's line (on a CPU too slow for the default job in its limit, a line saying so comes first)
    est = f"estimated {e['core_seconds']:.0f} core-seconds (4 runs, 6 jobs)"
    assert any(l.startswith(est) for l in capsys.readouterr().out.splitlines())
    # as flowgrpo fidelity writes them
    compare_cli.__wrapped__(seeds=[0, 1], tasks=['geneval'], arms=['flow_grpo,dense'], set=['lr=1e-3'], estimate=True)
    assert any(l.startswith(est) for l in capsys.readouterr().out.splitlines())
    # the quick one: 55 runs, a base evaluation per seed
    assert len(job_costs(CompareConfig('quick'))) == 5 * (6 + 5) + 5
    assert len(job_costs(CompareConfig())) == 2 * 2 + 2  # the main job: 2 seeds of flow_grpo and dense, and their bases

def test_the_quick_job_runs_the_seeds_that_fit(capsys, tmp_path, monkeypatch):
    """On a machine too slow for all five seeds of the quick comparison in 30 minutes (an AVX2 CPU's committed probe),
    `flowgrpo compare --budget quick` runs the first seeds that fit and says so; given seeds run as given; the main job
    fits there."""
    from flowgrpo_nb import precision
    from flowgrpo_nb.study.costs import limit_of
    probe = json.loads((Path(flowgrpo_nb.__file__).parent.parent/'results/machines/amd-epyc-avx2.json')
                       .read_text())['probe_ms_per_row']
    slow = {p: {k: None if v is None else v / 1000 for k, v in r.items()} for p, r in probe.items()}
    key = precision.machine_key()
    monkeypatch.setitem(precision._MEMO, json.dumps(key, sort_keys=True),
                        dict(key=key, timings=slow, fast=False, why='an AVX2 probe'))
    compare_cli.__wrapped__(out=str(tmp_path/'c'), budget='quick', estimate=True)
    line, est = capsys.readouterr().out.splitlines()[:2]
    fit = tuple(int(s) for s in line.split('running seeds ')[1].split(' (')[0].split())
    assert line.startswith("the quick job's 5 seeds would take") and line.endswith('--seeds 0 1 2 3 4 runs every one')
    assert 2 <= len(fit) < 5 and fit == tuple(range(len(fit)))
    e = estimate_cost(CompareConfig('quick', seeds=fit))
    assert (e['wall_seconds'] <= limit_of('quick')
            and est.startswith(f"estimated {e['core_seconds']:.0f} core-seconds ({e['runs']} runs"))
    # asked for: all five, with the warning
    compare_cli.__wrapped__(out=str(tmp_path/'c'), budget='quick', seeds=[0, 1, 2, 3, 4], estimate=True)
    line, est = capsys.readouterr().out.splitlines()[:2]
    assert line.endswith(f"; --seeds {' '.join(map(str, fit))} would take "
                         f"{estimate_cost(CompareConfig('quick', seeds=fit))['wall_seconds'] / 60:.0f}")
    assert est.startswith(f"estimated {estimate_cost(CompareConfig('quick'))['core_seconds']:.0f} "
                          "core-seconds (55 runs")
    compare_cli.__wrapped__(out=str(tmp_path/'m'), estimate=True)   # the main job: no line over its limit there
    assert capsys.readouterr().out.startswith(f"estimated {estimate_cost(CompareConfig())['core_seconds']:.0f} "
                                              "core-seconds (4 runs")

def test_reach_ignores_the_base_point():
    "A seed where Flow-GRPO ends below the base model is not 'reached' at step 0: only trained evaluations count."
    from flowgrpo_nb.study.results import CurvePoint
    curve = [CurvePoint(step=s, seconds=c, eval=e, se=0.01)
             for s, c, e in ((0, 0.0, 0.47), (12, 5.0, 0.45), (24, 9.0, 0.46))]
    assert first_reach(curve, 0.458) == dict(target=0.458, steps=24, nfe=None, seconds=9.0)
    assert first_reach(curve, 0.465) == dict(target=0.465, steps=None, nfe=None, seconds=None)

def test_a_format_2_report_of_an_earlier_version_reads_and_renders():
    """tests/data/report_format2.json, written by the version before the split: it reads as records without the study's
    measures, and renders."""
    from flowgrpo_nb.study.page import study_rows
    d = json.loads((Path(__file__).parent/'data'/'report_format2.json').read_text())
    rep = Report.from_json(d)
    assert rep.format == 2 and rep.tasks['geneval'].arms['dense'].auc is None and study_rows(rep, 'geneval')[1] == []
    assert findings(rep) == d['findings']  # it says what it said when it was written
    md = results_markdown(rep)
    assert 'flow_grpo_first4' in md and all(f in md for f in d['findings'])


def test_a_report_json_that_is_not_an_object_is_one_sentence(task, tmp_path):
    from flowgrpo_nb.study.runs import earlier_invocations
    from flowgrpo_nb.study.record import read_invocations
    (tmp_path/'report.json').write_text('[1, 2]')
    with pytest.raises(ValueError, match=r"report.json holds a JSON list, not a comparison report \(an object\); "
                                         r"move it away or use another --out$"):
        compare(tmp_path, CompareConfig(**ONE), task=task, policy=load_policy('tiny'), progress=False, workers=1)
    assert not (tmp_path/'invocations.jsonl').exists()  # refused before any work
    (tmp_path/'report.json').write_text('{"timing": [3], "wall_seconds": 5}')  # an odd timing block is no timing
    assert earlier_invocations(tmp_path) == [dict(wall_seconds=5, runs_trained=0)]
    # a line that is not an object is skipped
    (tmp_path/'invocations.jsonl').write_text('[1]\n{"id": "a", "wall_seconds": 2}\n')
    assert read_invocations(tmp_path) == [dict(wall_seconds=2, runs_trained=None, id='a')]

def test_the_confirm_budget_at_smoke_sizes(tmp_path):
    """The pre-registered study end to end at smoke sizes over three seeds (a claim needs two degrees of freedom): every
    arm its file names trains, and every claim of the file gets a verdict, an effect with its interval, and an MDE at
    the Holm level of its own family."""
    from flowgrpo_nb.study.design import load_prereg, prereg_file
    pre = load_prereg(prereg_file())
    ccfg = CompareConfig('confirm', seeds=(0, 1, 2), overrides=SMOKE)
    report = compare(tmp_path, ccfg, progress=False, png=False)
    assert set(report.tasks['geneval'].arms) == {a for c in pre.claims for a in (c.arm, c.other)} | {'flow_grpo'}
    post = [c for c in report.contrasts if c.family == 'post hoc']  # the level claims again at equal compute
    assert [c.id for c in report.contrasts if c.family != 'post hoc'] == [c.id for c in pre.claims]
    assert {c.id.split('@')[0] for c in post} == {c.id for c in pre.claims if c.claim == 'level'}
    for c in report.contrasts:
        if c.family == 'post hoc': continue
        assert c.n == 3 and c.verdict != 'not run' and c.ci and c.family in ('primary', 'secondary'), c
        # at 2 steps two arms can score alike on both seeds: no spread, no MDE to state
        assert c.mde is not None or not c.sd, c
    assert any(c.mde is not None for c in report.contrasts)
    assert {c.family_size for c in report.contrasts if c.family == 'primary'} == {len(pre.primary)}
    page = (tmp_path/'report.html').read_text()
    assert (pre.claims[0].question in page
            and page.index('<h2>The pre-registered claims</h2>') < page.index('<h2>Setup</h2>'))
    pr = report.setup['prereg']  # the registration: the file, and whether the code of every invocation came after it
    assert pr['file'] == 'design/confirm_prereg.toml' and len(pr['sha256']) == 64
    assert pr['commit'] is None or (len(pr['invocations']) == 1 and pr['invocations'][0]['after'] in (True, None))
