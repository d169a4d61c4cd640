"""Every tensor a resume restores is checked against the model before any rollout: a checkpoint file changed after it
was written (its checksum rewritten to match) is one sentence naming the file and the tensor, exit status 2."""
import json, os, shutil, subprocess, sys
from pathlib import Path
import pytest, torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from flowgrpo_nb.checkpoint import _digest
import warm  # python commands in a warm interpreter (tests/warm.py)

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
SMOKE = ['--preset', 'flow_grpo+smoke', '--quiet', '--set', 'log_with=none', 'eval_images=0', 'save_every=1',
         'ema=true', 'ema_decay=0.9']

def flowgrpo(*args):
    return warm.run([sys.executable, '-m', 'flowgrpo_nb.cli', *map(str, args)], cwd=ROOT, env=ENV,
                    capture_output=True, text=True, timeout=600)

@pytest.fixture(scope='module')
def run(tmp_path_factory):
    "A 2-step smoke run with an EMA (its LoRA file holds the EMA, live.safetensors the live adapter)."
    out = tmp_path_factory.mktemp('tensors')/'r'
    r = flowgrpo('train', '--out', out, *SMOKE, 'steps=2')
    assert r.returncode == 0, r.stderr[-3000:]
    return out

def rewrite(ckpt:Path, name:str, change, drop:str|None=None):
    "Rewrite `name` of `ckpt` with `change(tensors)` and its checksum in state.json, as a careful forger would."
    f = ckpt/name
    with safe_open(str(f), 'pt') as fh: meta = fh.metadata()
    tensors = change(load_file(str(f)))
    save_file(tensors, str(f), metadata=meta)
    st = json.loads((ckpt/'state.json').read_text())
    st['files'][name] = _digest(f)
    if drop: (ckpt/drop).unlink(); st['files'].pop(drop)
    (ckpt/'state.json').write_text(json.dumps(st))

def first(d:dict) -> str: return sorted(d)[0]

CASES = {
    'live': ('live.safetensors', lambda t: t | {'0': t['0'].half()}, None, "tensor '0' is"),
    'optimizer': ('optimizer.safetensors', lambda t: t | {'0.exp_avg': t['0.exp_avg'].reshape(-1)}, None,
                  "tensor '0.exp_avg' is"),
    'lora (the EMA)': ('pytorch_lora_weights.safetensors', lambda t: t | {first(t): t[first(t)].t().contiguous()},
                       None, 'lora_'),
    'lora dtype': ('pytorch_lora_weights.safetensors', lambda t: t | {first(t): t[first(t)].half()}, None, 'float16'),
    # the older layout: ema.safetensors beside the LoRA file, no live.safetensors
    'ema': ('ema.safetensors', lambda t: t | {'1': t['1'][:1]}, 'live.safetensors', "tensor '1' is"),
}

def changed(run:Path, tmp_path:Path, case:str) -> tuple[Path, Path, str]:
    "A copy of `run` whose newest checkpoint has the change of `case`: (folder, changed file, words of the sentence)."
    name, change, drop, words = CASES[case]
    out = tmp_path/'r'; shutil.copytree(run, out)
    ckpt = out/'checkpoints'/'ckpt-000002'
    if name == 'ema.safetensors':  # made from the live file, as an older version wrote it
        shutil.copy(ckpt/'live.safetensors', ckpt/name)
        st = json.loads((ckpt/'state.json').read_text()); st['files'][name] = _digest(ckpt/name)
        (ckpt/'state.json').write_text(json.dumps(st))
    rewrite(ckpt, name, change, drop)
    return out, ckpt/name, words

def test_a_changed_tensor_is_one_sentence_rc_2_before_any_rollout(run, tmp_path):
    out, f, words = changed(run, tmp_path, 'live')
    lines = (out/'metrics.jsonl').read_text()
    r = flowgrpo('train', '--out', out, '--resume', *SMOKE, 'steps=3')
    said = [l for l in r.stderr.splitlines() if l.startswith('flowgrpo ')]
    assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr[-2000:]
    assert len(said) == 1 and str(f) in said[0] and words in said[0], r.stderr
    assert (out/'metrics.jsonl').read_text() == lines  # no step ran

@pytest.mark.parametrize('case', [c for c in CASES if c != 'live'])
def test_every_checkpoint_file_is_checked(run, tmp_path, case):
    "The resume of each changed file stops in GRPOTrainer.load, naming the file and the tensor (in-process: quicker)."
    from flowgrpo_nb.checkpoint import CheckpointError, RunFolder
    from flowgrpo_nb.config import run_config
    from flowgrpo_nb.train import GRPOTrainer
    out, f, words = changed(run, tmp_path, case)
    with pytest.raises(CheckpointError) as e:
        GRPOTrainer(run_config(RunFolder(out)), out, resume=True, progress=False)
    assert str(e.value).startswith(f"{f}: tensor ") and words in str(e.value), str(e.value)

def test_the_unchanged_checkpoint_resumes(run, tmp_path):
    from flowgrpo_nb.checkpoint import RunFolder
    from flowgrpo_nb.config import run_config
    from flowgrpo_nb.train import GRPOTrainer
    out = tmp_path/'r'; shutil.copytree(run, out)
    t = GRPOTrainer(run_config(RunFolder(out)), out, resume=True, progress=False)
    assert t.step == 2
    if t.lock is not None: t.lock.release()

def test_compare_checks_a_reused_runs_final_adapter(base, tmp_path):
    "A finished run's final LoRA file is verified (checksum) and its tensors checked before `compare` counts it."
    import copy
    from flowgrpo_nb.config import preset_config, run_config
    from flowgrpo_nb.checkpoint import CheckpointError, RunFolder
    from flowgrpo_nb.train import GRPOTrainer
    from flowgrpo_nb.study.runs import _check_final_adapter
    cfg = preset_config('flow_grpo+smoke', log_with='none', eval_images=0, prompts_per_step=2, group_size=2,
                        minibatch=2, fast=False, steps=1)
    t = GRPOTrainer(cfg, tmp_path/'r', policy=copy.deepcopy(base[0]), task=base[1], progress=False,
                    evaluate_base=False)
    t.train_step(); t.save()
    if t.lock is not None: t.lock.release()
    cfg, refs = run_config(RunFolder(tmp_path/'r')), {}
    _check_final_adapter(tmp_path/'r', base[0], cfg, refs)  # as written: counted
    ckpt = tmp_path/'r'/'checkpoints'/'ckpt-000001'
    lora = ckpt/'pytorch_lora_weights.safetensors'
    data = bytearray(lora.read_bytes()); data[-1] ^= 1; lora.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match='pytorch_lora_weights.safetensors is corrupt'):
        _check_final_adapter(tmp_path/'r', base[0], cfg, refs)
    rewrite(ckpt, lora.name, lambda t: t | {first(t): t[first(t)].double()})
    with pytest.raises(CheckpointError, match=r"pytorch_lora_weights.safetensors: tensor .* float64; the model's"):
        _check_final_adapter(tmp_path/'r', base[0], cfg, refs)
