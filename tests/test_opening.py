"""Opening a run folder runs none of its code: a `py:MODULE:FUNCTION` reward planted in a run's config.json is not
imported by the app, by `fidelity` without --trust-code, or by a comparison's rebuilt report."""
import copy, json, os, subprocess, sys
from dataclasses import asdict
from pathlib import Path
import pytest
from flowgrpo_nb.config import preset_config
from flowgrpo_nb.train import GRPOTrainer
import warm  # python commands in a warm interpreter (tests/warm.py)

ROOT = Path(__file__).resolve().parent.parent
PLANTED = '''from pathlib import Path
Path(__file__).with_name('MARKER').write_text('imported')
import torch
def make():
    Path(__file__).with_name('MARKER').write_text('called')
    return lambda images, prompts: torch.zeros(len(prompts))
'''

@pytest.fixture(scope='module')
def planted(tmp_path_factory, base):
    """A runs folder holding one run (one step, a checkpoint) whose config.json names the planted reward
    `py:planted_reward:make`; the module writes MARKER beside it when imported."""
    d = tmp_path_factory.mktemp('opening')
    (d/'code').mkdir(); (d/'code'/'planted_reward.py').write_text(PLANTED)
    (d/'prompts.txt').write_text('a circle\na red square\n')
    pol, task = base
    cfg = preset_config('flow_grpo+smoke', log_with='none', eval_images=0, prompts_per_step=2, group_size=2,
                        minibatch=2, fast=False, steps=1)
    t = GRPOTrainer(cfg, d/'runs'/'r', policy=copy.deepcopy(pol), task=task, progress=False, evaluate_base=False)
    t.train_step(); t.save()
    if t.lock is not None: t.lock.release()
    c = json.loads((f := d/'runs'/'r'/'config.json').read_text())
    f.write_text(json.dumps(c | dict(reward='py:planted_reward:make', prompts=str(d/'prompts.txt'))))
    sys.path.insert(0, str(d/'code'))
    yield d
    sys.path.remove(str(d/'code'))
    sys.modules.pop('planted_reward', None)

def test_the_app_shows_the_run_without_its_reward(planted):
    from flowgrpo_nb.bank import ModelBank
    bank = ModelBank(planted/'runs')
    assert not (planted/'code'/'MARKER').exists()
    assert [m.name for m in bank.models] == ['r'] and 'not run' in bank.task.name
    assert bank.task.train_prompts == ['a circle', 'a red square']

def test_fidelity_names_the_module_and_runs_it_only_when_asked(planted, tmp_path):
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONPATH': os.pathsep.join([str(planted/'code'),
                                                                                  os.environ.get('PYTHONPATH', '')])}
    r = warm.run([sys.executable, '-m', 'flowgrpo_nb.cli', 'fidelity', '--run', str(planted/'runs'/'r'), '--out',
                  str(tmp_path/'f')], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr[-2000:]
    assert "would import module 'planted_reward'" in r.stderr and '--trust-code' in r.stderr, r.stderr
    assert not (planted/'code'/'MARKER').exists() and not (tmp_path/'f').exists()

def test_fidelity_with_trust_code_runs_it(planted):
    from flowgrpo_nb.study.fidelity import FidelityConfig
    from flowgrpo_nb.study.fidelity_report import fidelity_report
    cfg = FidelityConfig(prompts=2, batch_prompts=1, group=2, K=4, M=2, n_boot=20)
    try:
        res = fidelity_report(None, cfg, run=planted/'runs'/'r', arms='flow_grpo', base=False, trust_code=True)
        assert res['finetuned']['settings']['reward'] == 'py:planted_reward:make'
        assert (planted/'code'/'MARKER').read_text() == 'called'
    finally: (planted/'code'/'MARKER').unlink(missing_ok=True)

def test_a_rebuilt_report_runs_no_code_of_its_compare_json(planted, tmp_path):
    from flowgrpo_nb.study.design import CompareConfig
    from flowgrpo_nb.study.compare import rebuild_report
    ccfg = CompareConfig(budget='smoke', overrides=dict(reward='py:planted_reward:make',
                                                        prompts=str(planted/'prompts.txt')))
    (tmp_path/'compare.json').write_text(json.dumps(asdict(ccfg)))
    with pytest.raises(ValueError, match=r"compare.json would import module 'planted_reward'"):
        rebuild_report(tmp_path)
    assert not (planted/'code'/'MARKER').exists()
