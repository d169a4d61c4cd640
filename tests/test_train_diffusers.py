"""The real path on the CPU: `flowgrpo train --model sd3|flux --model-path DIR --prompts FILE --reward clip:DIR` for
every method, with evaluation, resume and the run's LoRA in a diffusers pipeline."""
import json, os, subprocess, sys
from pathlib import Path
import pytest, torch
from safetensors.torch import load_file
import warm  # python commands in a warm interpreter (tests/warm.py)

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
METHODS = ('flow_grpo', 'stepwise', 'dense', 'turning_point', 'tempflow', 'flash')

@pytest.fixture(scope='module')
def folders(tmp_path_factory):
    """Tiny random SD3 and FLUX pipelines, a tiny random CLIP and a prompt folder, saved locally as a user would have
    them."""
    from flowgrpo_nb.sd3 import tiny_sd3_pipeline
    from flowgrpo_nb.flux import tiny_flux_pipeline
    from flowgrpo_nb.rewards import tiny_clip_folder
    d = tmp_path_factory.mktemp('models')
    tiny_sd3_pipeline().save_pretrained(d/'sd3'); tiny_flux_pipeline().save_pretrained(d/'flux')
    tiny_clip_folder(d/'clip')
    (d/'prompts').mkdir()
    (d/'prompts'/'train.txt').write_text('a photo of a cat\ntwo dogs on a bench\na red car\na blue umbrella\n')
    (d/'prompts'/'test.txt').write_text('a green apple\na sign that says "open"\n')
    return d

def train(folders, model, method, out, *extra, steps=2):
    return warm.run([sys.executable, '-m', 'flowgrpo_nb.cli', 'train', '--preset', f'{method}+smoke', '--out',
                     str(out), '--model', model, '--model-path', str(folders/model), '--prompts',
                     str(folders/'prompts'), '--reward', f'clip:{folders/"clip"}', '--quiet',
                     '--set', f'steps={steps}', 'save_every=1', 'resolution=16', 't5=false', 'eval_images=4',
                     'log_with=none', 'calib_iters=1', *extra], cwd=ROOT, env=ENV, capture_output=True, text=True,
                    timeout=900)

def assert_loads_into_the_pipeline(folders, model, ckpt, lora):
    """As a user loads it: the base folder's diffusers pipeline takes the run's LoRA with `load_lora_weights`, trained
    weights and all."""
    from diffusers import FluxPipeline, StableDiffusion3Pipeline
    pipe = (StableDiffusion3Pipeline.from_pretrained(folders/'sd3', text_encoder_3=None, tokenizer_3=None)
            if model == 'sd3' else FluxPipeline.from_pretrained(folders/'flux'))
    pipe.load_lora_weights(ckpt)
    (name,) = pipe.get_list_adapters()['transformer']
    loaded = {k: v for k, v in pipe.transformer.state_dict().items() if f'.{name}.' in k}
    assert len(loaded) == len(lora) and sum(v.abs().sum() for k, v in loaded.items() if 'lora_B' in k) > 0
    assert sorted(v.abs().sum().item() for v in loaded.values()) == \
        pytest.approx(sorted(v.abs().sum().item() for v in lora.values()))

@pytest.mark.parametrize('model', ['sd3', 'flux'])
@pytest.mark.parametrize('method', METHODS)
def test_train_eval_resume(folders, tmp_path, model, method):
    r = train(folders, model, method, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f'results in {tmp_path}' in r.stdout
    rows = [json.loads(l) for l in (tmp_path/'metrics.jsonl').read_text().splitlines()]
    evals = [h for h in rows if 'eval_overall' in h]
    # evaluated on the task's own reward (the CLIP score of the test prompts)
    assert [h['step'] for h in evals] == [0, 2]
    first = json.loads((tmp_path/'doctor.json').read_text())  # the first step's checks (`05g_first_step`)
    assert first['ratio_err'] < 1e-3 and first['logp_nonfinite'] == 0 and first['noise0_err'] in (0.0, None)
    lora = load_file(tmp_path/'checkpoints'/'ckpt-000002'/'pytorch_lora_weights.safetensors')
    assert all(k.startswith('transformer.') for k in lora)  # diffusers' LoRA naming
    assert_loads_into_the_pipeline(folders, model, tmp_path/'checkpoints'/'ckpt-000002', lora)
    r = train(folders, model, method, tmp_path, '--resume', steps=3)
    assert r.returncode == 0, r.stderr[-3000:]
    assert [json.loads(l)['step'] for l in (tmp_path/'metrics.jsonl').read_text().splitlines()][-1] == 3

def test_grid_reward_on_sd3_is_refused_early(folders, tmp_path):
    r = warm.run([sys.executable, '-m', 'flowgrpo_nb.cli', 'train', '--out', str(tmp_path/'x'), '--model', 'sd3',
                  '--model-path', str(folders/'sd3'), '--quiet'], cwd=ROOT, env=ENV, capture_output=True,
                 text=True)
    assert r.returncode == 2 and "reward='partial' is the grid world's" in r.stderr and 'Traceback' not in r.stderr
    assert not (tmp_path/'x').exists()

def test_gradient_checkpointing(folders, tmp_path):
    """`--set gradient_checkpointing=true` reaches diffusers' transformer and changes no result; a run resumes with it
    switched off."""
    from flowgrpo_nb.config import preset_config
    from flowgrpo_nb.task import load_policy
    cfg = preset_config('flow_grpo+smoke', model='sd3', model_path=str(folders/'sd3'), prompts=str(folders/'prompts'),
                        reward=f'clip:{folders/"clip"}', resolution=16, t5=False, gradient_checkpointing=True)
    # what the trainer loads
    assert load_policy(device='cpu', **cfg.backend(train=True)).transformer.gradient_checkpointing is True
    # what evaluation loads
    assert load_policy(device='cpu', **cfg.backend()).transformer.gradient_checkpointing is False
    for name, flag in (('plain', 'false'), ('ckpt', 'true')):
        r = train(folders, 'sd3', 'flow_grpo', tmp_path/name, f'gradient_checkpointing={flag}')
        assert r.returncode == 0, r.stderr[-3000:]
    a, b = (load_file(tmp_path/n/'checkpoints'/'ckpt-000002'/'pytorch_lora_weights.safetensors')
            for n in ('plain', 'ckpt'))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert any(a[k].abs().sum() > 0 for k in a if 'lora_B' in k), 'the adapter was trained'
    r = train(folders, 'sd3', 'flow_grpo', tmp_path/'ckpt', 'gradient_checkpointing=false', '--resume', steps=3)
    assert r.returncode == 0, r.stderr[-3000:]

@pytest.mark.parametrize('model', ['sd3', 'flux'])
def test_published_recipe_by_default(folders, tmp_path, model):
    """`--model sd3|flux` trains with Flow-GRPO's released recipe: named on the first line, recorded in config.json;
    --set wins."""
    from flowgrpo_nb.config import RECIPES
    small = ['prompts_per_step=1', 'group_size=2', 'minibatch=1', 'K=2', 'max_batch=2']  # sizes only, for a CPU
    r = warm.run([sys.executable, '-m', 'flowgrpo_nb.cli', 'train', '--out', str(tmp_path), '--model', model,
                  '--model-path', str(folders/model), '--prompts', str(folders/'prompts'), '--reward',
                  f'clip:{folders/"clip"}', '--quiet', '--set', 'steps=1', 'resolution=16', 't5=false',
                  'eval_images=0', 'log_with=none', 'lr=2e-4', *small], cwd=ROOT, env=ENV, capture_output=True,
                 text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    name = {'sd3': 'sd35m_geneval', 'flux': 'flux_pickscore'}[model]
    first = r.stdout.splitlines()[0]
    assert first.startswith(f'recipe {name} (Flow-GRPO config/grpo.py ') and '--set: lr=0.0002, ' in first, first
    cfg = json.loads((tmp_path/'config.json').read_text())
    rec = RECIPES[name]
    assert cfg['recipe'] == name and cfg['lr'] == 2e-4  # --set wins over the recipe
    kept = ('beta', 'lora_rank', 'lora_alpha', 'level', 'guidance', 'updates_per_rollout', 'ema', 'keep_last', 'shift')
    assert {k: cfg[k] for k in kept} == {k: rec.get(k, 1.0) for k in kept}  # shift: FLUX's stays 1
    lora = load_file(tmp_path/'checkpoints'/'ckpt-000001'/'pytorch_lora_weights.safetensors')
    assert {v.shape[0] for k, v in lora.items() if 'lora_A' in k} == {rec['lora_rank']}
    assert any('.ff.net.2.' in k for k in lora) == (model == 'flux')  # FLUX's released targets include the MLPs
