"""fast='auto' through the command line: the machine's choice is read from its cached measurement (faked here, so the
tests hold on every CPU), the path a run takes is recorded in its config.json and base.json and printed first, and a
resumed run keeps the path it started on, bitwise, saying in one sentence that this machine would choose otherwise."""
import json, subprocess, sys
from pathlib import Path
import pytest
from flowgrpo_nb.precision import machine_key
from flowgrpo_nb.config import run_config, GRPOConfig
sys.path.insert(0, str(Path(__file__).parent))
from test_train import ROOT, ENV, cmd, final_state, assert_same_run
import warm  # python commands in a warm interpreter (tests/warm.py)

def faked(d:Path, fast:bool) -> dict:
    """An environment whose cache says this machine runs bf16 faster (`fast`) or slower: the trainer reads it instead of
    timing."""
    t = dict(fp32=dict(forward=1e-3, update=2e-3),
             bf16=dict(forward=2.5e-4, update=5e-4) if fast else dict(forward=8e-3, update=None))
    why = f"{'bf16 fast' if fast else 'fp32 eager'} path: faked by the test"
    key = machine_key()
    (d/'precision.json').write_text(json.dumps({json.dumps(key, sort_keys=True):
                                                dict(key=key, timings=t, fast=fast, why=why, measured='test')}))
    return {**ENV, 'FLOWGRPO_CACHE': str(d)}

def run(out, env, *extra, steps=4, quiet=True):
    c = cmd(out, 'flow_grpo', *extra, steps=steps)
    if not quiet: c.remove('--quiet')
    r = warm.run(c, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return r

@pytest.mark.parametrize('machine,fast,path', [(True, 'auto', True), (False, 'auto', False), (True, 'false', False)])
def test_the_path_a_run_takes_is_recorded(tmp_path, machine, fast, path):
    env = faked(tmp_path, machine)
    r = run(tmp_path/'run', env, '--set', f'fast={fast}', steps=1, quiet=False)
    assert run_config(tmp_path/'run').fast is path  # config.json holds the path run, never 'auto'
    want = 'bf16 fast' if path else 'fp32 eager'
    rec = json.loads((tmp_path/'run'/'base.json').read_text())['precision']
    assert rec['path'] == want and (('faked by the test' in rec['why']) == (fast == 'auto'))
    recipe, first = r.stdout.split('\n')[:2]  # the recipe in force, then the run's first line: which path and why
    assert recipe.startswith('recipe tiny') and f"{want} path (" in first, r.stdout

def test_auto_resumes_on_the_recorded_path(tmp_path):
    """A run started with fast=true, resumed with fast=auto on a machine that would take fp32: bf16 to the end, bitwise
    the straight run."""
    env = faked(tmp_path, False)  # 2 steps, stopped after the first (a checkpoint every step): bf16 is slow on AVX2
    run(tmp_path/'straight', env, '--set', 'fast=true', steps=2)
    run(tmp_path/'stopped', env, '--set', 'fast=true', steps=1)
    r = run(tmp_path/'stopped', env, '--resume', steps=2)
    assert run_config(tmp_path/'stopped').fast is True
    assert 'started on the bf16 fast path and resumes on it; this machine would choose the fp32 eager one' in r.stderr
    assert '--set fast=false' in r.stderr
    assert_same_run(final_state(tmp_path/'straight', 2), final_state(tmp_path/'stopped', 2))

def test_forcing_the_other_path_on_resume_is_refused(tmp_path):
    env = faked(tmp_path, False)
    run(tmp_path/'run', env, '--set', 'fast=true', steps=2)
    c = cmd(tmp_path/'run', 'flow_grpo', '--resume', '--set', 'fast=false', steps=4)
    r = warm.run(c, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and 'fast (run: True, now: False)' in r.stderr and len(r.stderr.strip().splitlines()) == 1

def test_a_config_without_the_field_reads_as_eager(tmp_path):
    d = GRPOConfig().to_dict(); d.pop('fast')
    (tmp_path/'config.json').write_text(json.dumps(d))
    assert run_config(tmp_path).fast is False

def test_base_evaluation_is_reused_under_auto(tmp_path, monkeypatch):
    """A comparison's base evaluation made on one path is what fast=auto reuses (its runs ran on that path); an explicit
    other path evaluates anew."""
    import flowgrpo_nb.study.runs as C, flowgrpo_nb.precision as P
    from flowgrpo_nb.config import preset_config
    from flowgrpo_nb.task import load_policy, load_task
    pol, task, f = load_policy('tiny'), load_task('partial'), tmp_path/'base.json'
    first = C.base_eval(pol, task, preset_config('flow_grpo+smoke', eval_images=4, fast=True), f, progress=False)
    faked(tmp_path, False); monkeypatch.setenv('FLOWGRPO_CACHE', str(tmp_path)); P._MEMO.clear()
    try:
        assert P.resolve_fast('auto')[0] is False
        def refuse(*a, **k): raise AssertionError('evaluated anew')
        monkeypatch.setattr(C, 'evaluate_policy', refuse)
        assert C.base_eval(pol, task, preset_config('flow_grpo+smoke', eval_images=4), f, progress=False).to_dict() == \
            first.to_dict()
        with pytest.raises(AssertionError, match='evaluated anew'):
            C.base_eval(pol, task, preset_config('flow_grpo+smoke', eval_images=4, fast=False), f, progress=False)
    finally: P._MEMO.clear()

def test_the_reproducible_mode_runs_pinned_and_twice_the_same(tmp_path, monkeypatch):
    """`--reproducible` from a Python process that has torch loaded runs the command in a pinned child; `--set
    reproducible=true` in a fresh process pins it before torch loads; both record the mode and train bitwise alike."""
    from flowgrpo_nb import cli
    from test_train import args, final_state, assert_same_run
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    assert 'torch' in sys.modules and cli.main(['train', '--out', str(tmp_path/'a'), *args('flow_grpo', 1),
                                                '--reproducible']) == 0
    run(tmp_path/'b', ENV, '--set', 'reproducible=true', steps=1)
    for r in ('a', 'b'):
        cfg, rec = run_config(tmp_path/r), json.loads((tmp_path/r/'base.json').read_text())['precision']
        assert cfg.reproducible is True and cfg.fast is False, r
        # torch's own report, in the run's process: its kernels at the baseline level, not this CPU's
        assert rec['path'] == 'fp32 eager' and "reproducible mode: fp32 eager, torch's kernels at DEFAULT" in rec['why']
    assert_same_run(final_state(tmp_path/'a', 1), final_state(tmp_path/'b', 1))

def test_the_reproducible_mode_runs_fp32():
    with pytest.raises(ValueError, match=r"GRPOConfig.fast=True: .*reproducible=true"): GRPOConfig(reproducible=True,
                                                                                                  fast=True)
