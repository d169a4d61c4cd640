"""Trainer runs through the CLI: exact resume after clean stops for every method, run-twice equality, two processes
(the resumes after SIGKILL: tests/test_train_kill.py, against the same straight runs)."""
import json, os, subprocess, sys
from pathlib import Path
import pytest, torch
from safetensors.torch import load_file
import warm  # python commands in a warm interpreter (tests/warm.py)

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
METHODS = ('flow_grpo', 'stepwise', 'dense', 'turning_point', 'dense_latent')  # dense_latent: its value resumes too
STEPS = 8
# 8 steps of 2 prompts x 4 samples, K = 4, a checkpoint every step, all kept, evaluations at 0, 5 and 8
def args(method, steps=STEPS):
    return ['--preset', f'{method}+smoke', '--quiet', '--set', f'steps={steps}', 'save_every=1', 'keep_last=50',
            'log_with=none', 'calib_iters=1', 'eval_images=8', 'eval_every=5']

def cmd(out, method, *extra, steps=STEPS):
    return [sys.executable, '-m', 'flowgrpo_nb.cli', 'train', '--out', str(out), *args(method, steps), *extra]

def train(out, method, *extra, steps=STEPS):
    r = warm.run(cmd(out, method, *extra, steps=steps), cwd=ROOT, env=ENV, capture_output=True, text=True,
                 timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return r

def final_state(out, step=STEPS) -> dict:
    "Every tensor and JSON value of the checkpoint of `step`, and the log without timings."
    ck = Path(out)/'checkpoints'/f'ckpt-{step:06d}'
    st = {f.name: load_file(f) for f in ck.glob('*.safetensors')}
    st['state.json'] = {k: v for k, v in json.loads((ck/'state.json').read_text()).items() if k != 'files'}
    # timings
    for k in ('seconds', 'cpu_seconds'): ((st['state.json'].get('calibration') or {}).get('cost') or {}).pop(k, None)
    # the log's training rows without timings (a clean stop adds an evaluation at its last step: evaluations read the
    # state, they never change it, so they are left out of the comparison)
    st['metrics'] = [{k: v for k, v in json.loads(l).items() if not k.startswith(('sec_', 'cpu_', 'eval_'))}
                     for l in (Path(out)/'metrics.jsonl').read_text().splitlines()]
    st['metrics'] = [r for r in st['metrics'] if len(r) > 1]
    return st

def assert_same_run(a:dict, b:dict):
    assert a.keys() == b.keys()
    for name in a:
        if name.endswith('.safetensors'):
            assert a[name].keys() == b[name].keys(), name
            for k in a[name]: assert torch.equal(a[name][k], b[name][k]), f'{name}: {k} differs'
        else: assert a[name] == b[name], name

def _train_straight(root:Path):
    procs = {m: warm.Popen(cmd(root/m, m), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for m in METHODS}
    for m, p in procs.items():
        _, err = p.communicate(timeout=900)
        assert p.returncode == 0, err.decode()[-3000:]

def straight_runs(shared_cache) -> dict:
    """The uninterrupted STEPS-step run of each method: {method: folder}, trained once per pytest run for this file and
    tests/test_train_kill.py (read, never written, by the tests)."""
    root = shared_cache(f'train_straight_{STEPS}', _train_straight)
    return {m: root/m for m in METHODS}

@pytest.fixture(scope='session')
def straight(shared_cache): return straight_runs(shared_cache)

# stops: after the first step, before, at and after an evaluation (5), one before the end
@pytest.mark.parametrize('method,stop', [('flow_grpo', 3), ('stepwise', 7), ('dense', 1), ('turning_point', 5),
                                         ('dense_latent', 6)])
def test_resume_after_clean_stop_is_exact(straight, tmp_path, method, stop):
    "Stop cleanly after `stop` steps, resume to STEPS: every tensor of the final checkpoint equals the straight run's."
    train(tmp_path, method, steps=stop)
    train(tmp_path, method, '--resume')
    assert_same_run(final_state(straight[method]), final_state(tmp_path))

# appended to args()'s --set
SAFEGUARDS = ('ema=true', 'updates_per_rollout=2', 'beta=0.04', 'weight_decay=1e-4', 'lr_warmup=3')

def test_resume_with_the_safeguards_is_exact(tmp_path):
    """EMA, two optimizer steps per batch, a KL term and an lr warmup: a run stopped after 2 steps (inside the 3-step
    warmup) and resumed ends bitwise where the 5-step straight run ends (the EMA's weights and step count, Adam's state
    and the warmup's step all restored). A decaying schedule depends on `steps`, so there a resume with other `steps`
    is refused."""
    a, b = tmp_path/'straight', tmp_path/'resumed'
    train(a, 'flow_grpo', *SAFEGUARDS, steps=5)
    train(b, 'flow_grpo', *SAFEGUARDS, steps=2)
    train(b, 'flow_grpo', *SAFEGUARDS, '--resume', steps=5)
    sa, sb = final_state(a, 5), final_state(b, 5)
    assert ('live.safetensors' in sa and any(m['clipfrac'] > 0 for m in sa['metrics'])
            and all(m.get('kl') is not None for m in sa['metrics']))
    assert_same_run(sa, sb)
    r = warm.run(cmd(tmp_path/'cos', 'flow_grpo', 'lr_schedule=cosine', steps=2), cwd=ROOT, env=ENV,
                 capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    r = warm.run(cmd(tmp_path/'cos', 'flow_grpo', 'lr_schedule=cosine', '--resume', steps=4), cwd=ROOT, env=ENV,
                 capture_output=True, text=True)
    assert r.returncode == 2 and 'differing fields: steps (run: 2, now: 4)' in r.stderr, r.stderr[-2000:]

def test_same_command_twice_is_bitwise_equal(straight, tmp_path):
    """Every tensor equal, and every file of the final checkpoint byte-identical: state.json's checksums compare two
    runs."""
    train(tmp_path, 'flow_grpo')
    assert_same_run(final_state(straight['flow_grpo']), final_state(tmp_path))
    files = lambda out: json.loads((Path(out)/'checkpoints'/f'ckpt-{STEPS:06d}'/'state.json').read_text())['files']
    assert files(straight['flow_grpo']) == files(tmp_path)  # sha256 and size of the adapter, optimizer, RNG, config

def test_two_processes_match_one(straight, tmp_path):
    "The same run under `accelerate launch --num_processes 2` reaches the same adapter up to float error."
    r = subprocess.run([sys.executable, '-m', 'accelerate.commands.launch', '--cpu', '--num_processes', '2',
                        '--num_machines', '1', '--mixed_precision', 'no', '--dynamo_backend', 'no',
                        '-m', 'flowgrpo_nb.cli', 'train', '--out', str(tmp_path), *args('dense', 6)],
                       cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-5000:]
    a, b = final_state(straight['dense'], 6), final_state(tmp_path, 6)
    la, lb = a['pytorch_lora_weights.safetensors'], b['pytorch_lora_weights.safetensors']
    for k in la: torch.testing.assert_close(la[k], lb[k], rtol=1e-4, atol=1e-5, msg=k)

def test_loss_steps_apart_from_the_exploration_window(tmp_path):
    """Flow-GRPO exploring with the SDE on steps 0-8 but trained on steps 0-3 (train_size=4) draws the same rollouts as
    Flow-GRPO trained on 0-8, and back-propagates only steps 0-3: the other steps' advantages are exactly 0, so their
    gradient is."""
    from flowgrpo_nb.config import preset_config
    from flowgrpo_nb.train import GRPOTrainer
    kw = dict(K=10, steps=1, eval_images=0, log_with='none', skip_zero_adv=False)
    full, four = (GRPOTrainer(preset_config('flow_grpo+smoke', **kw, **extra), tmp_path/name, progress=False)
                  for name, extra in (('full', {}), ('four', dict(train_size=4))))
    assert full.cfg.rollout_config().window == four.cfg.rollout_config().window == (0, 9)
    assert four.cfg.loss_steps().nonzero().flatten().tolist() == [0, 1, 2, 3]
    a, b = full.collect(0), four.collect(0)
    for name in ('x', 'log_prob', 'reward'):
        assert torch.equal(getattr(a['rollout'], name), getattr(b['rollout'], name)), name
    assert torch.equal(a['advantages'][:, :4], b['advantages'][:, :4]) and not b['advantages'][:, 4:].any()
    assert a['advantages'][:, 4:9].any()  # the control has credit there
    shares_full, shares_four = (full.grad_shares(a['rollout'], a['advantages']),
                                four.grad_shares(b['rollout'], b['advantages']))
    assert (all(shares_four[f'grad_share_{k}'] == 0 for k in range(4, 9))
            and sum(shares_four[f'grad_share_{k}'] for k in range(4)) == pytest.approx(1))
    assert sum(shares_full[f'grad_share_{k}'] for k in range(4, 9)) > 0.05
    for t in (full, four): t.lock.release()

def _train_cmd(out, *sets):
    return [sys.executable, '-m', 'flowgrpo_nb.cli', 'train', '--out', str(out), '--preset', 'flow_grpo+smoke',
            '--quiet', '--set', 'steps=2', 'eval_images=8', *sets]

def test_log_with_wandb_offline(tmp_path):
    """`--set log_with=wandb` logs each step into the run folder, offline when no API key is at hand (nothing is online
    here)."""
    pytest.importorskip('wandb')
    env = {k: v for k, v in ENV.items() if k not in ('WANDB_MODE', 'WANDB_API_KEY')} | dict(HOME=str(tmp_path/'home'))
    r = warm.run(_train_cmd(tmp_path/'run', 'log_with=wandb'), cwd=tmp_path, env=env, capture_output=True,
                 text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    logs = list((tmp_path/'run'/'wandb').glob('offline-run-*/*.wandb'))
    assert len(logs) == 1, list((tmp_path/'run').rglob('*'))[:20]
    row = json.loads((tmp_path/'run'/'metrics.jsonl').read_text().splitlines()[1])
    assert all(k.encode() in logs[0].read_bytes() for k in row), 'every logged metric reached wandb'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['home', 'run'], 'nothing written outside the run folder'

def test_log_with_a_tracker_not_installed_is_one_sentence(tmp_path):
    from accelerate.tracking import get_available_trackers
    from flowgrpo_nb.config import trackers
    have = [str(t.value) for t in get_available_trackers()]
    missing = next(t for t in trackers() if t not in have + ['none'])
    r = warm.run(_train_cmd(tmp_path/'run', f'log_with={missing}'), cwd=ROOT, env=ENV, capture_output=True,
                 text=True, timeout=300)
    lines = [l for l in r.stderr.splitlines() if l.strip() and not l.startswith('[transformers]')
             and 'torchvision' not in l]
    assert r.returncode == 2 and lines == [f"flowgrpo train: log_with={missing!r}: the {missing} package is not "
                                           f"installed; install it (pip install {missing}) or pick one that is: "
                                           f"{', '.join(have + ['none'])}"], r.stderr
    assert not (tmp_path/'run').exists(), 'nothing written'
