"`flowgrpo doctor`: a healthy smoke run holds every check (exit 0); each planted failure fails its check (exit 1)."
import json, shutil, warnings
from pathlib import Path
import pytest
from flowgrpo_nb import cli, train
from flowgrpo_nb.config import preset_config
from flowgrpo_nb.train import GRPOTrainer

CFG = dict(steps=2, eval_every=2, beta=0.01, log_with='none', seed=3)

def smoke(out:Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        GRPOTrainer(preset_config('flow_grpo+smoke', **CFG), out, progress=False).train()
    return out

@pytest.fixture(scope='module')
def run(tmp_path_factory) -> Path:
    "One two-step smoke run with beta > 0, evaluated at its start and end, shared by every test here."
    return smoke(tmp_path_factory.mktemp('doctor')/'run')

def doctor(run:Path, capsys) -> tuple[int, list[str]]:
    "The exit status and check lines of `flowgrpo doctor RUN`."
    try: status = cli.main(['doctor', str(run)])
    except SystemExit as e: status = e.code
    return status, capsys.readouterr().out.splitlines()[:-1]

def test_a_healthy_run_holds_every_check(run, capsys):
    status, lines = doctor(run, capsys)
    assert status == 0 and len(lines) == 10 and all(l.startswith('held') for l in lines), lines

def planted(run:Path, to:Path, first:dict|None=None, rows=None) -> Path:
    "A copy of `run` (no checkpoints) with doctor.json fields `first` and metrics rows edited by `rows(list)`."
    shutil.copytree(run, to, ignore=shutil.ignore_patterns('checkpoints'))
    if first: (to/'doctor.json').write_text(json.dumps(json.loads((to/'doctor.json').read_text()) | first))
    if rows:
        ms = [json.loads(l) for l in (to/'metrics.jsonl').read_text().splitlines()]
        (to/'metrics.jsonl').write_text(''.join(json.dumps(m) + '\n' for m in rows(ms)))
    return to

def tie_all(ms): return [m | ({'zero_spread': 1.0} if 'sec_step' in m else {}) for m in ms]

def hack(ms):
    "Training reward up from 0.2 to 0.9 while the held-out score falls from 0.6 to 0.3 (SE 0.02)."
    out = []
    for m in ms:
        if 'sec_step' in m: m = m | dict(reward=0.2 if m['step'] == 1 else 0.9)
        if 'eval_overall' in m: m = m | dict(eval_overall=0.6 if m['step'] == 0 else 0.3, eval_overall_se=0.02)
        out.append(m)
    return out

CASES = {  # planted failure: (doctor.json fields, metrics edit, the check that fails, its number)
    'ratio': (dict(ratio_err=0.25), None, 'first ratio', 'max |ratio - 1| = 0.25'),
    'nan log-prob': (dict(logp_nonfinite=3), None, 'log-probs', '3 non-finite'),
    'nan loss': (None, lambda ms: [m | ({'loss': float('nan')} if 'sec_step' in m else {}) for m in ms], 'finite loss',
                 '2 steps with a non-finite loss'),
    'kl without gradient': (dict(kl_grad=False), None, 'KL gradient', 'has NO gradient'),
    'noise-0 mismatch': (dict(noise0_err=0.2), None, 'noise 0 vs ODE', 'max relative difference 0.2 '),
    'all groups tied': (None, tie_all, 'tied groups', 'mean share 1.00'),
    'hacking': (None, hack, 'hacking', 'training reward +0.700, held-out learned'),
}

@pytest.mark.parametrize('case', CASES)
def test_a_planted_failure_fails_its_check(run, tmp_path, capsys, case):
    first, rows, name, number = CASES[case]
    status, lines = doctor(planted(run, tmp_path/'planted', first, rows), capsys)
    line = next(l for l in lines if l.split(maxsplit=1)[1].startswith(name))
    assert status == 1 and line.startswith('FAILED') and number in line and '— fix: ' in line, lines
    if case != 'hacking':  # the held-out fall of the planted hacking is a collapse too
        assert sum(l.startswith('FAILED') for l in lines) == 1, lines

def test_not_a_run_folder_is_one_sentence(tmp_path, capsys):
    assert cli.main(['doctor', str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count('\n') == 0 and 'not a trainer run folder' in err

def test_the_first_step_checks_change_nothing(run, tmp_path, monkeypatch):
    "The same run without the first step's checks: the same adapter bits and the same metrics (timings aside)."
    monkeypatch.setattr(train, 'first_step', lambda *a: None)
    other = smoke(tmp_path/'without')
    assert not (other/'doctor.json').exists()
    last = lambda d: sorted((d/'checkpoints').glob('ckpt-*'))[-1]/'pytorch_lora_weights.safetensors'
    assert last(run).read_bytes() == last(other).read_bytes()
    rows = lambda d: [{k: v for k, v in json.loads(l).items() if not k.startswith(('sec_', 'cpu_'))}
                      for l in (d/'metrics.jsonl').read_text().splitlines()]
    assert rows(run) == rows(other)

def test_model_measures_again(run, tmp_path, capsys):
    "--model loads the run's newest checkpoint and measures the first step's checks anew, not reading doctor.json."
    d = planted(run, tmp_path/'planted', dict(ratio_err=0.25, kl_grad=False))
    shutil.copytree(run/'checkpoints', d/'checkpoints')
    assert cli.main(['doctor', str(d), '--model']) == 0
    lines = capsys.readouterr().out.splitlines()
    assert all(l.startswith('held') for l in lines[:-1]), lines
