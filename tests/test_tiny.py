"Dense checks of flowgrpo_nb.tiny: config validation, checkpoint checks, exact resume, sampling, the shipped model."
import json, time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from flowgrpo_nb.tiny import (ASSETS, TinyConfig, TinyFlowModel, check_config, eval_prompts, evaluate, export_tiny,
                              flow_loss, generate, load_tiny, model_card, pretrain, read_log, save_tiny, tiny_meta)
from flowgrpo_nb.world import CATEGORIES, VOCAB, parse_prompt, prompt_split, sample_batch

torch.set_num_threads(1)
SMALL = TinyConfig(text_dim=32, text_heads=2, text_layers=1, pooled_dim=32, num_layers=1, num_heads=2, head_dim=16)


@pytest.fixture(scope='module')
def small(): torch.manual_seed(0); return TinyFlowModel(SMALL).eval()


@pytest.mark.parametrize('kw, field', [(dict(num_layers=0), 'num_layers'), (dict(patch_size=5), 'patch_size'),
                                       (dict(text_heads=3), 'text_heads'), (dict(t_min=0.0), 't_min'),
                                       (dict(head_dim=2.5), 'head_dim')])
def test_config_errors_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field): TinyConfig(**kw)


def test_shapes_and_velocity(small):
    hidden, pooled = small.encode(['a red circle and a blue square', ''])
    assert hidden.shape == (2, SMALL.max_words, SMALL.text_dim) and pooled.shape == (2, SMALL.pooled_dim)
    x, t = torch.randn(2, 3, 32, 32), torch.tensor([0.9, 0.0])
    with torch.no_grad(): v, x0 = small.velocity(x, t, hidden, pooled), small.predict_x0(x, t, hidden, pooled)
    torch.testing.assert_close(v, (x - x0) / torch.tensor([0.9, SMALL.t_min]).view(-1, 1, 1, 1))
    with torch.no_grad():  # a float t equals the same t per row
        torch.testing.assert_close(small.velocity(x, 0.3, hidden, pooled), small.velocity(x, torch.full((2,), 0.3), hidden, pooled))


def test_bf16_velocity(small):
    m = TinyFlowModel(SMALL).to(torch.bfloat16)
    with torch.no_grad(): v = m.velocity(torch.randn(2, 3, 32, 32, dtype=torch.bfloat16), 0.5, *m.encode(['a circle', '']))
    assert v.dtype == torch.bfloat16 and torch.isfinite(v.float()).all()


def test_unknown_word_rejected(small):
    with pytest.raises(ValueError, match='dog'): small.encode(['a dog'])


def test_generate_reproducible(small):
    a = generate(small, ['a circle', 'two squares'], K=3, generator=torch.Generator().manual_seed(1))
    b = generate(small, ['a circle', 'two squares'], K=3, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(a, b)
    assert a.shape == (2, 3, 32, 32) and a.min() >= 0 and a.max() <= 1
    with pytest.raises(ValueError, match='K=0'): generate(small, ['a circle'], K=0)


def test_checkpoint_roundtrip_and_mismatch(small, tmp_path):
    save_tiny(small, tmp_path / 'm.safetensors', note='x')
    m = load_tiny(tmp_path / 'm.safetensors')
    assert m.config == SMALL
    for (a, x), (b, y) in zip(small.state_dict().items(), m.state_dict().items()):
        torch.testing.assert_close(x.half().float(), y)
    with pytest.raises(ValueError, match="'num_layers'"): load_tiny(tmp_path / 'm.safetensors', config=TinyConfig(
        **{**SMALL.__dict__, 'num_layers': 2}))
    meta = json.loads((tmp_path / 'm.json').read_text())
    (tmp_path / 'm.json').write_text(json.dumps({**meta, 'vocab': VOCAB[::-1]}))
    with pytest.raises(ValueError, match="'vocab'"): load_tiny(tmp_path / 'm.safetensors')
    (tmp_path / 'm.json').write_text(json.dumps({**meta, 'config': {**meta['config'], 'vocab_size': 99}}))
    with pytest.raises(ValueError, match="'vocab_size'"): load_tiny(tmp_path / 'm.safetensors')
    (tmp_path / 'm.json').write_text(json.dumps({**meta, 'config': {**meta['config'], 'depth': 3}}))
    with pytest.raises(ValueError, match="'depth'"): load_tiny(tmp_path / 'm.safetensors')
    with pytest.raises(ValueError, match='no checkpoint'): load_tiny(tmp_path / 'missing.safetensors')


def test_mismatch_raises_before_building(monkeypatch, tmp_path, small):
    save_tiny(small, tmp_path / 'm.safetensors')
    import flowgrpo_nb.tiny as tiny
    monkeypatch.setattr(tiny, 'TinyFlowModel', lambda *a, **k: pytest.fail('model built before the config check'))
    with pytest.raises(ValueError, match="'head_dim'"):
        tiny.load_tiny(tmp_path / 'm.safetensors', config=TinyConfig(**{**SMALL.__dict__, 'head_dim': 8}))


def test_check_config_names_first_difference():
    with pytest.raises(ValueError, match="'text_dim' = 64"): check_config({**SMALL.__dict__, 'text_dim': 64}, SMALL)
    check_config(dict(SMALL.__dict__), SMALL)


def test_flow_loss_reproducible(small):
    images, prompts = sample_batch(8, 'train', np.random.default_rng(0))
    a = flow_loss(small, images, prompts, generator=torch.Generator().manual_seed(0))
    b = flow_loss(small, images, prompts, generator=torch.Generator().manual_seed(0))
    assert a.item() == b.item() and a.item() > 0


def test_pretrain_resume_is_exact_and_loss_falls(tmp_path):
    kw = dict(batch_size=8, lr=1e-3, warmup=5, save_every=5, config=SMALL, progress=False)
    pretrain(tmp_path / 'a', steps=10, **kw)
    pretrain(tmp_path / 'b', steps=5, **kw)
    pretrain(tmp_path / 'b', steps=10, **kw)
    a, b = load_file(str(tmp_path / 'a' / 'state.safetensors')), load_file(str(tmp_path / 'b' / 'state.safetensors'))
    assert a.keys() == b.keys()
    for k in a: torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    assert [r['step'] for r in read_log(tmp_path / 'b')] == list(range(1, 11))
    loss = [r['loss'] for r in read_log(tmp_path / 'a')]
    assert np.mean(loss[-3:]) < np.mean(loss[:3])
    m = load_tiny(tmp_path / 'a' / 'ema-000010.safetensors')  # an EMA snapshot is a loadable checkpoint
    assert m.config == SMALL
    out = export_tiny(tmp_path / 'a', 10, tmp_path / 'ship' / 'tiny.safetensors', command='x')
    meta = tiny_meta(out)
    assert meta['step'] == 10 and meta['command'] == 'x' and meta['seed'] == 0 and meta['train_seconds'] > 0
    with pytest.raises(ValueError, match='step=7'): export_tiny(tmp_path / 'a', 7)


def test_pretrain_bad_args(tmp_path):
    with pytest.raises(ValueError, match='batch_size=0'): pretrain(tmp_path, steps=1, batch_size=0)
    with pytest.raises(ValueError, match='p_uncond=1'): pretrain(tmp_path, steps=1, p_uncond=1.0)


def test_eval_prompts_balanced_heldout():
    ps = eval_prompts(60, seed=3)
    held = set(prompt_split('heldout'))
    assert len(ps) == 60 and set(ps) <= held
    cats = [parse_prompt(p).category for p in ps]
    assert all(cats.count(c) == 10 for c in CATEGORIES)
    assert ps == eval_prompts(60, seed=3)
    with pytest.raises(ValueError, match='n=3'): eval_prompts(3)


# ---- the shipped checkpoint ----

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
    rep = evaluate(m, n=64, seed=5, batch_size=64)
    assert time.perf_counter() - t0 < 60  # seconds on an idle CPU; loose for shared CI machines
    assert 0.0 < rep.overall['strict'] < 1.0
