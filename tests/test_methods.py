"""A method is one entry (`flowgrpo_nb.method`): the registry lists the six, and a method written in a module outside
the package trains through the public API and through the command line, with no file of the package edited."""
import json, os, subprocess, sys, textwrap
from pathlib import Path
import pytest, torch
from flowgrpo_nb.config import preset_config, run_config
from flowgrpo_nb.method import BUILTIN_METHODS, method_of, method_names, methods_help
from flowgrpo_nb.train import GRPOTrainer
import warm  # python commands in a warm interpreter (tests/warm.py)

ROOT = Path(__file__).resolve().parent.parent

GAIN_SIGN = textwrap.dedent('''
    from flowgrpo_nb.collect import ValueRule
    from flowgrpo_nb.credit import Credit, CreditConfig, normalize_rewards, step_gains

    def credit_gain_sign(V, group, trained, cfg=None):
        "Each trained step's gain reduced to its sign, normalised per step within the group."
        cfg = cfg or CreditConfig()
        r = step_gains(V, trained, cfg.untrained).sign()
        return Credit(normalize_rewards(r, group, trained, cfg), r)

    GAIN_SIGN = ValueRule('gain_sign', "the sign of each step's ODE-completed gain", rule=credit_gain_sign,
                          lookahead='ode:rest')
''')

@pytest.fixture
def plugin(tmp_path, monkeypatch):
    "A module `gain_sign_plugin` in a temporary folder on sys.path; its spec."
    (tmp_path/'gain_sign_plugin.py').write_text(GAIN_SIGN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path, 'py:gain_sign_plugin:GAIN_SIGN'

def test_six_methods_each_one_entry():
    assert list(BUILTIN_METHODS) == ['flow_grpo', 'stepwise', 'dense', 'turning_point', 'tempflow', 'flash']
    assert method_names()[:6] == tuple(BUILTIN_METHODS)
    for n in BUILTIN_METHODS:
        m = method_of(n)
        assert m.name == n and m.summary and m.nfe(preset_config(n)) >= preset_config(n).K, n
        assert f'  {n}: {m.summary}' in methods_help()

def test_control_arms_are_presets_over_the_same_entries():
    for preset in ('flow_grpo_ddim', 'flow_grpo_early', 'mix_grpo'):
        assert method_of(preset_config(preset).method) is method_of('flow_grpo')

def test_unknown_method_is_one_sentence():
    with pytest.raises(ValueError, match=r"^GRPOConfig\.method='grpo' is unknown; allowed flow_grpo, stepwise"):
        preset_config('smoke', method='grpo')
    with pytest.raises(ValueError, match=r"cannot load 'NOPE' from module 'flowgrpo_nb.method'"):
        preset_config('smoke', method='py:flowgrpo_nb.method:NOPE')

def test_a_method_from_outside_trains_through_the_api(plugin, tmp_path):
    _, spec = plugin
    cfg = preset_config('smoke', method=spec, steps=2, save_every=0, eval_images=0, log_with='none')
    assert cfg.lookahead == 'ode:rest' and method_of(spec).name == 'gain_sign'
    s = GRPOTrainer(cfg, tmp_path/'run', progress=False).train()
    assert s['method'] == spec and s['steps'] == 2 and s['nfe_per_sample']['lookahead'] > 0
    assert run_config(tmp_path/'run').method == spec  # the run folder names it; reading it back loads it again

def test_a_method_from_outside_trains_through_the_cli(plugin):
    folder, spec = plugin
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), str(ROOT)]), OMP_NUM_THREADS='1')
    cmd = [sys.executable, '-m', 'flowgrpo_nb.cli', 'train', '--preset', 'smoke', '--method', spec, '--quiet',
           '--no-base-eval', '--out', str(folder/'cli_run'), '--set', 'steps=2', 'eval_images=0', 'log_with=none']
    r = warm.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((folder/'cli_run'/'summary.json').read_text())['steps'] == 2
    bad = warm.run(cmd[:7] + ['py:gain_sign_plugin:MISSING'] + cmd[8:], capture_output=True, text=True, env=env,
                   timeout=600)
    assert bad.returncode != 0 and 'Traceback' not in bad.stderr, bad.stderr[-2000:]
    assert "cannot load 'MISSING' from module 'gain_sign_plugin'" in bad.stdout + bad.stderr

def test_readme_lists_every_method_with_its_cost():
    "README's methods table (nbs/index.ipynb) has a row per built-in method, its NFE per sample from the entry."
    lines = (ROOT/'README.md').read_text().splitlines()
    ref = method_of('flow_grpo').nfe(preset_config('flow_grpo'))
    for n in BUILTIN_METHODS:
        m, c = method_of(n), preset_config(n)
        row = [line for line in lines if line.startswith(f'| {m.title} `{n}` | {m.summary} |')]
        assert len(row) == 1, n
        assert row[0].endswith(f"| {m.nfe(c):g} ({m.nfe(c) / ref:.1f}×) |"), row[0]
