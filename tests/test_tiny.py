"Dense checks of flowgrpo_nb.tiny: config validation, checkpoint checks, exact resume, sampling, the shipped model."
import json, time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from flowgrpo_nb.tiny import (ASSETS, TinyConfig, TinyFlowModel, check_config, export_tiny, flow_loss, generate,
                              load_tiny, pretrain, read_log, save_tiny, tiny_meta)
from flowgrpo_nb.card import eval_prompts, base_scores, model_card
from flowgrpo_nb.checkpoint import latest_checkpoint, list_checkpoints, read_checkpoint
from flowgrpo_nb.world import CATEGORIES, VOCAB, parse_prompt, prompt_split, sample_batch

torch.set_num_threads(1)


@pytest.fixture(scope='module')
def small(small_config): torch.manual_seed(0); return TinyFlowModel(small_config).eval()


@pytest.mark.parametrize('kw, field', [(dict(num_layers=0), 'num_layers'), (dict(patch_size=5), 'patch_size'),
                                       (dict(text_heads=3), 'text_heads'), (dict(t_min=0.0), 't_min'),
                                       (dict(head_dim=2.5), 'head_dim')])
def test_config_errors_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field): TinyConfig(**kw)


def test_shapes_and_velocity(small, small_config):
    hidden, pooled = small.encode(['a red circle and a blue square', ''])
    assert (hidden.shape == (2, small_config.max_words, small_config.text_dim)
            and pooled.shape == (2, small_config.pooled_dim))
    x, t = torch.randn(2, 3, 32, 32), torch.tensor([0.9, 0.0])
    with torch.no_grad(): v, x0 = small.velocity(x, t, hidden, pooled), small.predict_x0(x, t, hidden, pooled)
    torch.testing.assert_close(v, (x - x0) / torch.tensor([0.9, small_config.t_min]).view(-1, 1, 1, 1))
    with torch.no_grad():  # a float t equals the same t per row
        torch.testing.assert_close(small.velocity(x, 0.3, hidden, pooled),
                                   small.velocity(x, torch.full((2,), 0.3), hidden, pooled))


def test_bf16_velocity(small, small_config):
    m = TinyFlowModel(small_config).to(torch.bfloat16)
    with torch.no_grad():
        v = m.velocity(torch.randn(2, 3, 32, 32, dtype=torch.bfloat16), 0.5, *m.encode(['a circle', '']))
    assert v.dtype == torch.bfloat16 and torch.isfinite(v.float()).all()


def test_unknown_word_rejected(small):
    with pytest.raises(ValueError, match='dog'): small.encode(['a dog'])


def test_generate_reproducible(small):
    a = generate(small, ['a circle', 'two squares'], K=3, generator=torch.Generator().manual_seed(1))
    b = generate(small, ['a circle', 'two squares'], K=3, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(a, b)
    assert a.shape == (2, 3, 32, 32) and a.min() >= 0 and a.max() <= 1
    with pytest.raises(ValueError, match='K=0'): generate(small, ['a circle'], K=0)


def test_checkpoint_roundtrip_and_mismatch(small, tmp_path, small_config):
    save_tiny(small, tmp_path / 'm.safetensors', note='x')
    m = load_tiny(tmp_path / 'm.safetensors')
    assert m.config == small_config
    for (a, x), (b, y) in zip(small.state_dict().items(), m.state_dict().items()):
        torch.testing.assert_close(x.half().float(), y)
    with pytest.raises(ValueError, match="'num_layers'"): load_tiny(tmp_path / 'm.safetensors', config=TinyConfig(
        **{**small_config.__dict__, 'num_layers': 3}))
    meta = json.loads((tmp_path / 'm.json').read_text())
    (tmp_path / 'm.json').write_text(json.dumps({**meta, 'vocab': VOCAB[::-1]}))
    with pytest.raises(ValueError, match="'vocab'"): load_tiny(tmp_path / 'm.safetensors')
    (tmp_path / 'm.json').write_text(json.dumps({**meta, 'config': {**meta['config'], 'vocab_size': 99}}))
    with pytest.raises(ValueError, match="'vocab_size'"): load_tiny(tmp_path / 'm.safetensors')
    (tmp_path / 'm.json').write_text(json.dumps({**meta, 'config': {**meta['config'], 'depth': 3}}))
    with pytest.raises(ValueError, match="'depth'"): load_tiny(tmp_path / 'm.safetensors')
    with pytest.raises(ValueError, match='no checkpoint'): load_tiny(tmp_path / 'missing.safetensors')


def test_mismatch_raises_before_building(monkeypatch, tmp_path, small, small_config):
    save_tiny(small, tmp_path / 'm.safetensors')
    import flowgrpo_nb.tiny as tiny
    monkeypatch.setattr(tiny, 'TinyFlowModel', lambda *a, **k: pytest.fail('model built before the config check'))
    with pytest.raises(ValueError, match="'head_dim'"):
        tiny.load_tiny(tmp_path / 'm.safetensors', config=TinyConfig(**{**small_config.__dict__, 'head_dim': 8}))


def test_check_config_names_first_difference(small_config):
    with pytest.raises(ValueError, match="'text_dim' = 64"):
        check_config({**small_config.__dict__, 'text_dim': 64}, small_config)
    check_config(dict(small_config.__dict__), small_config)


def test_flow_loss_reproducible(small):
    images, prompts = sample_batch(8, 'train', np.random.default_rng(0))
    a = flow_loss(small, images, prompts, generator=torch.Generator().manual_seed(0))
    b = flow_loss(small, images, prompts, generator=torch.Generator().manual_seed(0))
    assert a.item() == b.item() and a.item() > 0


def test_pretrain_resume_is_exact_and_loss_falls(tmp_path, small_config):
    kw = dict(batch_size=8, lr=1e-3, warmup=5, save_every=5, config=small_config, progress=False)
    pretrain(tmp_path / 'a', steps=10, **kw)
    pretrain(tmp_path / 'b', steps=5, **kw)
    pretrain(tmp_path / 'b', steps=10, **kw)
    assert [c.name for c in list_checkpoints(tmp_path / 'a')] == ['ckpt-000005', 'ckpt-000010']  # keep_last=2
    a, b = (read_checkpoint(latest_checkpoint(tmp_path / r)) for r in 'ab')
    assert a.keys() == b.keys() == {'model.safetensors', 'ema.safetensors', 'optimizer.safetensors', 'optimizer.json',
                                    'state.json'}
    for f in ('model.safetensors', 'ema.safetensors', 'optimizer.safetensors'):
        assert a[f].keys() == b[f].keys()
        for k in a[f]: torch.testing.assert_close(a[f][k], b[f][k], rtol=0, atol=0)
    assert a['optimizer.json'] == b['optimizer.json'] and a['state.json']['step'] == b['state.json']['step'] == 10
    assert [r['step'] for r in read_log(tmp_path / 'b')] == list(range(1, 11))
    loss = [r['loss'] for r in read_log(tmp_path / 'a')]
    assert np.mean(loss[-3:]) < np.mean(loss[:3])
    m = load_tiny(tmp_path / 'a' / 'ema-000010.safetensors')  # an EMA snapshot is a loadable checkpoint
    assert m.config == small_config
    out = export_tiny(tmp_path / 'a', 10, tmp_path / 'ship' / 'tiny.safetensors', command='x')
    meta = tiny_meta(out)
    assert meta['step'] == 10 and meta['command'] == 'x' and meta['seed'] == 0 and meta['train_seconds'] > 0
    with pytest.raises(ValueError, match='step=7'): export_tiny(tmp_path / 'a', 7)


def test_pretrain_bad_args(tmp_path):
    with pytest.raises(ValueError, match='batch_size=0'): pretrain(tmp_path, steps=1, batch_size=0)
    with pytest.raises(ValueError, match='p_uncond=1'): pretrain(tmp_path, steps=1, p_uncond=1.0)
    with pytest.raises(ValueError, match='keep_last=0'): pretrain(tmp_path, steps=1, keep_last=0)


def test_pretrain_resume_skips_a_corrupt_checkpoint_and_refuses_the_old_state(tmp_path, small_config):
    kw = dict(batch_size=4, lr=1e-3, warmup=2, save_every=2, config=small_config, progress=False)
    pretrain(tmp_path / 'a', steps=4, **kw)
    (tmp_path / 'a' / 'checkpoints' / 'ckpt-000004' / 'model.safetensors').write_bytes(b'0' * 10)
    with pytest.warns(UserWarning, match='model.safetensors is corrupt.*resuming from ckpt-000002'):
        pretrain(tmp_path / 'a', steps=4, **kw)
    assert read_checkpoint(latest_checkpoint(tmp_path / 'a'))['state.json']['step'] == 4
    (tmp_path / 'old').mkdir(); (tmp_path / 'old' / 'state.safetensors').write_bytes(b'')
    with pytest.raises(ValueError, match='older version .state.safetensors.'): pretrain(tmp_path / 'old', steps=1, **kw)


def test_eval_prompts_balanced_heldout():
    ps = eval_prompts(60, seed=3)
    held = set(prompt_split('heldout'))
    assert len(ps) == 60 and set(ps) <= held
    cats = [parse_prompt(p).category for p in ps]
    assert all(cats.count(c) == 10 for c in CATEGORIES)
    assert ps == eval_prompts(60, seed=3)
    with pytest.raises(ValueError, match='n=3'): eval_prompts(3)


# ---- the shipped checkpoint ----

def test_load_tiny_is_the_shipped_weights_bitwise():
    "load_tiny() gives the shipped fp16 tensors, cast to fp32, exactly (the model RL starts from)."
    sd, m = load_file(str(ASSETS / 'tiny.safetensors')), load_tiny()
    assert m.state_dict().keys() == sd.keys()
    assert all(torch.equal(v, sd[k].float()) for k, v in m.state_dict().items())


def test_shipped_checkpoint():
    path = ASSETS / 'tiny.safetensors'
    assert path.stat().st_size <= 15e6
    sd = load_file(str(path))
    assert all(v.dtype == torch.float16 for v in sd.values())
    meta = tiny_meta()
    for k in ('command', 'seed', 'step', 'train_seconds', 'scores', 'eval', 'sample_seconds_64'): assert k in meta
    assert meta['config'] == TinyConfig().__dict__


def test_shipped_quality_band_recorded():
    s = tiny_meta()['scores']
    assert 0.25 <= s['overall']['strict'] <= 0.75
    strict = [s[c]['strict'] for c in CATEGORIES]
    assert max(strict) < 0.9 and min(strict) < 0.4


def test_shipped_model_card_is_current():
    assert (ASSETS / 'MODEL_CARD.md').read_text() == model_card()


def test_shipped_samples_64_fast_and_scored():
    t0 = time.perf_counter()
    m = load_tiny()
    rep = base_scores(m, n=64, seed=5, batch_size=64)
    assert time.perf_counter() - t0 < 60  # seconds on an idle CPU; loose for shared CI machines
    assert 0.0 < rep.overall['strict'] < 1.0
