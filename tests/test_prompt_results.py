"""Per-prompt results of an evaluation: logged by a run, read by the study, estimated right (issue 50, item 2)."""
import copy, importlib.util, json, math
from pathlib import Path
import pytest, torch

from flowgrpo_nb.checkpoint import RunFolder
from flowgrpo_nb.config import preset_config
from flowgrpo_nb.study.results import run_report
from flowgrpo_nb.study.stats import eval_se, paired_eval
from flowgrpo_nb.task import EvalReport, PromptScores, evaluate_policy
from flowgrpo_nb.train import GRPOTrainer, eval_settings

ROOT = Path(__file__).resolve().parent.parent

def categories(task): return [task.category(p) for p in task.eval_prompts]

def test_a_run_logs_per_prompt_results_and_the_study_reads_them(base, tmp_path):
    "Every evaluation row of metrics.jsonl carries the lists over the task's prompts; a run record's curve reads them."
    policy, task = base
    cfg = preset_config('flow_grpo+smoke', steps=2, eval_images=12, log_with='none')
    tr = GRPOTrainer(cfg, tmp_path/'run', policy=copy.deepcopy(policy), task=task, progress=False)
    tr.train(); tr.acc.end_training()
    rows = [m for m in RunFolder(tmp_path/'run').metrics() if 'eval_overall' in m]
    assert [m['step'] for m in rows] == [0, 2]
    for m in rows:
        assert len(m['eval_prompts_n']) == len(m['eval_prompts_mean']) == len(task.eval_prompts)
        assert sum(m['eval_prompts_n']) == 12 and 'eval_prompts_names' not in m
        # the overall score again from the logged per-prompt results (means rounded to 4 decimals)
        assert eval_se(m['eval_prompts_n'], m['eval_prompts_mean'], categories(task))['overall'] == pytest.approx(
            m['eval_overall'], abs=1e-4)
    base_rep = evaluate_policy(copy.deepcopy(policy), task, **eval_settings(cfg))
    run = run_report(tmp_path/'run', base_rep)
    assert all(isinstance(p.prompts, PromptScores) for p in run.curve) and run.curve[0].prompts == base_rep.prompts
    assert run.curve[-1].prompts.n == rows[-1]['eval_prompts_n']
    js = json.loads(json.dumps(run.to_json()))  # report.json keeps the final evaluation's only
    assert ['prompts' in p for p in js['curve']] == [False, True]
    # the same prompts and noise at every evaluation of a run: the base and the final pair prompt by prompt
    pe = paired_eval(run.curve[-1].prompts.n, run.curve[-1].prompts.mean, base_rep.prompts.mean, categories(task))
    assert run.curve[0].prompts.n == run.curve[-1].prompts.n
    assert pe['mean'] == pytest.approx(run.curve[-1].eval - run.curve[0].eval, abs=1e-4)

def test_eval_se_reproduces_the_logged_se(base):
    "From an evaluation's per-prompt results, `eval_se` gives its overall score and the prompt-clustered SE it logs."
    policy, task = base
    rep = evaluate_policy(copy.deepcopy(policy), task, n_images=60, K=4, seed=5)
    es = eval_se(rep.prompts.n, rep.prompts.mean, categories(task))
    assert es['overall'] == pytest.approx(rep.overall, abs=1e-12)
    assert es['clustered'] == pytest.approx(rep.overall_se, rel=1e-9)
    # binomial: p(1 - p) / (N - 1) per category from the category means alone
    binom = math.sqrt(sum(c['score'] * (1 - c['score']) / (c['n'] - 1) for c in rep.categories.values())) / 6
    assert es['se'] == pytest.approx(binom, rel=1e-9)

def test_the_committed_evaluations_read_without_per_prompt_results():
    "Base evaluations cached before per-prompt results read as they were, with prompts None."
    d = json.loads(next((ROOT/'results'/'confirm'/'runs'/'base').glob('*/seed2000.json')).read_text())
    rep = EvalReport.from_dict(d)
    assert rep.prompts is None and rep.overall == d['overall'] and 'prompts' not in rep.to_dict()
    assert not any(k.startswith('eval_prompts') for k in rep.metrics())

def test_eval_noise_json_is_what_its_script_computes():
    "results/eval_noise/eval_noise.json's analysis is recomputed from the per-image scores it keeps."
    spec = importlib.util.spec_from_file_location('eval_noise', ROOT/'benchmarks'/'eval_noise.py')
    en = importlib.util.module_from_spec(spec); spec.loader.exec_module(en)
    data = json.loads(en.OUT.read_text())
    assert len(data['draws']) == len(en.SEEDS) and data['machine']['cpu']
    plain = lambda x: json.loads(json.dumps(x))
    assert plain(en.analyse(data)) == data['sizes'] and plain(en.committed_base()) == data['committed_base']
