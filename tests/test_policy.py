"Dense checks of flowgrpo_nb.policy on a small random tiny model (CPU, seconds)."
import json, re

import pytest, torch
from safetensors import safe_open
from safetensors.torch import save_file

from flowgrpo_nb.tiny import TinyFlowModel, TinyPolicy, load_tiny
from flowgrpo_nb.policy import Cond, NFECounter, Policy, LORA_FILE, OLD_LORA_FILE, read_lora_file
from flowgrpo_nb.world import prompt_split

torch.set_num_threads(1)


@pytest.fixture
def policy(tiny_policy): return tiny_policy


def fresh(config):
    torch.manual_seed(0)
    return TinyPolicy(TinyFlowModel(config))


def test_cond_index_repeat_cat(policy):
    c = policy.encode(['a red circle', 'two squares'])
    r = c.repeat(3)
    assert len(r) == 6 and torch.equal(r.embeds[2], c.embeds[0]) and torch.equal(r.pooled[3], c.pooled[1])
    i = r.index(torch.tensor([5, 0]))
    assert torch.equal(i.embeds[0], c.embeds[1]) and torch.equal(i.neg_pooled[1], c.neg_pooled[0])
    both = Cond.cat([c, i])
    assert len(both) == 4 and torch.equal(both.embeds[2], c.embeds[1])


def test_encode_cache_matches_model(policy):
    c = policy.encode(['two squares', 'a red circle', 'two squares'])
    h, p = policy.module.encode(['two squares', 'a red circle', ''])
    torch.testing.assert_close(c.embeds[0], h[0]); torch.testing.assert_close(c.embeds[1], h[1])
    torch.testing.assert_close(c.pooled[2], p[0]); torch.testing.assert_close(c.neg_pooled[0], p[2])
    assert set(policy._cache) == {'', 'two squares', 'a red circle'}
    assert not c.embeds.requires_grad
    assert all(c.embeds.shape == (3, *v[0].shape) for v in policy._cache.values())
    with pytest.raises(ValueError, match='non-empty list of str'): policy.encode([])
    with pytest.raises(ValueError, match='non-empty list of str'): policy.encode(['a', 3])


def test_velocity_cfg_chunks_and_count(policy):
    x = policy.noise(5, torch.Generator().manual_seed(0))
    t = torch.linspace(1, 0.1, 5)
    c = policy.encode(['a red circle'] * 3 + ['two squares'] * 2)
    m = policy.module
    with torch.no_grad():
        v_c = m.velocity(x, t, c.embeds, c.pooled)
        v_u = m.velocity(x, t, c.neg_embeds, c.neg_pooled)
        with policy.count_nfe('x') as n:
            v = policy.velocity(x, t, c, 3.0)
            v_chunk = policy.velocity(x, t, c, 3.0, max_batch=2)
            v_scalar_t = policy.velocity(x, 0.5, c, 1.0)
    torch.testing.assert_close(v, v_u + 3.0 * (v_c - v_u), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(v_chunk, v, atol=1e-4, rtol=1e-4)
    assert v.dtype == torch.float32 and v_scalar_t.shape == x.shape
    assert n == {'nfe': 15, 'calls': 3}
    assert policy.nfe.nfe['x'] == 15 and policy.nfe.phase == 'other'
    with pytest.raises(ValueError, match='must match'): policy.velocity(x, t, c.index(slice(0, 2)))
    with pytest.raises(ValueError, match=r'must be \[B, 3, 32, 32\]'): policy.velocity(x[:, :2], t, c)
    with pytest.raises(ValueError, match=r'Tensor\[5\]'): policy.velocity(x, t[:2], c)


def test_nfe_counter_phases():
    n = NFECounter()
    n.add(3)
    with n('rollout') as a:
        n.add(4)
        with n('lookahead') as b: n.add(10); n.add(2)
        n.add(4)
    assert n.nfe == {'other': 3, 'rollout': 8, 'lookahead': 12} and n.calls['lookahead'] == 2
    assert a == {'nfe': 8, 'calls': 2} and b == {'nfe': 12, 'calls': 2}
    n.reset(); assert not n.nfe


def test_lora_zero_init_disable_and_grads(policy):
    x, t = policy.noise(3, torch.Generator().manual_seed(1)), torch.tensor([0.9, 0.5, 0.2])
    c = policy.encode(['a red circle'] * 3)
    with torch.no_grad(): base = policy.velocity(x, t, c, 4.0)
    with policy.disable_adapter():  # no adapter: a no-op
        with torch.no_grad(): torch.testing.assert_close(policy.velocity(x, t, c, 4.0), base)
    policy.add_lora(rank=2, alpha=4)
    params = policy.trainable_parameters()
    assert params and all(p.requires_grad for p in params)
    names = {n for n, p in policy.module.named_parameters() if p.requires_grad}
    assert all('lora' in n for n in names)
    for tg in ('to_q', 'add_k_proj', 'to_add_out', 'to_out.0'): assert any(f'.{tg}.lora_A' in n for n in names)
    with torch.no_grad():
        torch.testing.assert_close(policy.velocity(x, t, c, 4.0), base)
        for p in params: p.add_(0.1 * torch.randn_like(p))
        moved = policy.velocity(x, t, c, 4.0)
        with policy.disable_adapter(): ref = policy.velocity(x, t, c, 4.0)
        again = policy.velocity(x, t, c, 4.0)
    torch.testing.assert_close(ref, base)
    torch.testing.assert_close(again, moved)
    assert (moved - base).abs().max() > 1e-3
    assert all(p.requires_grad for p in policy.trainable_parameters())  # re-enabled after the block
    policy.velocity(x, t, c, 4.0).square().mean().backward()
    assert all(p.grad is not None for p in params)


def test_lora_errors(policy):
    with pytest.raises(ValueError, match='rank=0'): policy.add_lora(rank=0)
    with pytest.raises(ValueError, match='alpha=0'): policy.add_lora(alpha=0)
    with pytest.raises(ValueError, match='dropout=1'): policy.add_lora(dropout=1)
    with pytest.raises(ValueError, match="'nope'"): policy.add_lora(targets=('to_q', 'nope'))
    with pytest.raises(ValueError, match='no adapter'): policy.lora_state_dict()
    policy.add_lora(rank=2)
    with pytest.raises(ValueError, match='already has an adapter'): policy.add_lora()
    sd = policy.lora_state_dict()
    k = next(iter(sd))
    with pytest.raises(ValueError, match='has shape'): policy.load_lora_state_dict({**sd, k: torch.zeros(1, 1)})


def test_encoding_does_not_depend_on_the_batch():
    "Issue 14: a prompt's cached encoding is the same bits whatever was encoded with it (the shipped model, whose"
    " batched matmuls round differently for different batch sizes)."
    a, b = TinyPolicy(load_tiny()), TinyPolicy(load_tiny())
    prompts = prompt_split('train')[:3]
    a.encode(prompts)
    c = b.encode(prompts[2:])
    assert torch.equal(a._cache[prompts[2]][0], c.embeds[0]) and torch.equal(a._cache[prompts[2]][1], c.pooled[0])
    assert torch.equal(a._cache[''][0], c.neg_embeds[0])
    many = TinyPolicy(load_tiny())
    many.encode(prompt_split('train')[:40])
    for p in prompts: assert torch.equal(many._cache[p][1], a._cache[p][1]), p


def test_encode_each_is_one_prompt_per_call(policy, monkeypatch):
    calls = []
    orig = policy._encode
    monkeypatch.setattr(policy, '_encode', lambda ps: calls.append(list(ps)) or orig(ps))
    policy.encode(['two squares', 'a red circle', 'two squares'])
    policy.encode(['a red circle', 'three crosses'])
    assert calls == [[''], ['two squares'], ['a red circle'], ['three crosses']]


def moved(policy, **kw):
    policy.add_lora(**kw)
    with torch.no_grad():
        for p in policy.trainable_parameters(): p.normal_()
    return policy


def test_lora_save_load_roundtrip(policy, small_config, tmp_path):
    moved(policy, rank=3, alpha=5, targets=('to_q', 'to_v'))
    policy.save_lora(tmp_path)
    assert [f.name for f in tmp_path.iterdir()] == [LORA_FILE]
    (tmp_path/'sibling').write_text('')  # the LoRA file is readable as any file the process writes (diffusers: 0600)
    assert (tmp_path/LORA_FILE).stat().st_mode & 0o777 == (tmp_path/'sibling').stat().st_mode & 0o777
    (tmp_path/'sibling').unlink()
    with safe_open(str(tmp_path / LORA_FILE), 'pt') as fh:
        assert set(fh.keys()) == {f'transformer.{k}' for k in policy.lora_state_dict()}
        meta = json.loads(fh.metadata()['lora_adapter_metadata'])
    assert (meta['transformer.r'], meta['transformer.lora_alpha'], sorted(meta['transformer.target_modules'])) == \
        (3, 5, ['to_q', 'to_v'])
    other = fresh(small_config).load_lora(tmp_path)
    assert other.lora_config == dict(rank=3, alpha=5, targets=['to_q', 'to_v'], dropout=0.0)
    mine = policy.lora_state_dict()
    assert other.lora_state_dict().keys() == mine.keys()
    assert all(torch.equal(v, mine[k]) for k, v in other.lora_state_dict().items())  # bitwise
    x, c = policy.noise(2, torch.Generator().manual_seed(2)), policy.encode(['two squares'] * 2)
    with torch.no_grad():
        torch.testing.assert_close(other.velocity(x, 0.7, other.encode(['two squares'] * 2), 2.0),
                                   policy.velocity(x, 0.7, c, 2.0), atol=0, rtol=0)
    # a file, too
    same = fresh(small_config).add_lora(rank=3, alpha=5.0, targets=('to_v', 'to_q')).load_lora(tmp_path / LORA_FILE)
    assert all(torch.equal(v, mine[k]) for k, v in same.lora_state_dict().items())
    wrong = fresh(small_config).add_lora(rank=4)
    with pytest.raises(ValueError, match='differs'): wrong.load_lora(tmp_path)
    with pytest.raises(ValueError, match='no such LoRA file or folder'): wrong.load_lora(tmp_path / 'missing')
    (tmp_path / 'empty').mkdir()
    with pytest.raises(ValueError, match='no pytorch_lora_weights.safetensors .or the older lora.safetensors.'):
        wrong.load_lora(tmp_path / 'empty')
    with pytest.raises(ValueError, match='is a file'): policy.save_lora(tmp_path / LORA_FILE)


def test_old_lora_files_still_load(policy, small_config, tmp_path):
    "What the package wrote before: save_lora's lora.safetensors (config in metadata) and the trainer's (weights only)."
    sd = moved(policy, rank=2, alpha=4).lora_state_dict()
    (tmp_path / 'saved').mkdir(); (tmp_path / 'trainer').mkdir()
    save_file(sd, str(tmp_path / 'saved' / OLD_LORA_FILE), metadata={'lora_config': json.dumps(policy.lora_config)})
    save_file(sd, str(tmp_path / 'trainer' / OLD_LORA_FILE))
    a = fresh(small_config).load_lora(tmp_path / 'saved')
    assert a.lora_config == policy.lora_config and all(torch.equal(v, sd[k]) for k, v in a.lora_state_dict().items())
    with pytest.raises(ValueError, match='records no adapter shape'):
        fresh(small_config).load_lora(tmp_path / 'trainer')
    b = fresh(small_config).add_lora(rank=2, alpha=4).load_lora(tmp_path / 'trainer')
    assert all(torch.equal(v, sd[k]) for k, v in b.lora_state_dict().items())
    assert read_lora_file(tmp_path / 'trainer')[1] is None
    policy.save_lora(tmp_path / 'saved')  # both files in one folder: diffusers' name wins
    assert read_lora_file(tmp_path / 'saved')[1]['targets'] == sorted(policy.lora_config['targets'])


@pytest.mark.parametrize('content, why', [
    (dict(weight=torch.zeros(2)), 'is neither a diffusers LoRA file'),
    ({'text_encoder.layers.0.q_proj.lora_A.weight': torch.zeros(2, 2)}, 'is neither a diffusers LoRA file'),
    ({}, 'is neither a diffusers LoRA file'),
    (b'not safetensors', 'is not a safetensors file')])
def test_unreadable_lora_file_is_named(policy, tmp_path, content, why):
    f = tmp_path / 'adapter.safetensors'
    if isinstance(content, bytes): f.write_bytes(content)
    else: save_file(content, str(f))
    with pytest.raises(ValueError, match=re.escape(f"'{f}' {why}")): policy.load_lora(f)


def test_noise_decode(policy):
    g = torch.Generator().manual_seed(3)
    x = policy.noise(2, g)
    assert x.shape == (2, 3, 32, 32) and x.dtype == torch.float32
    img = policy.decode(torch.tensor([-2.0, -1.0, 0.0, 1.0, 3.0]).view(5, 1, 1, 1).expand(5, 3, 32, 32))
    assert img[:, 0, 0, 0].tolist() == [0.0, 0.0, 0.5, 1.0, 1.0]


def test_base_class_is_abstract():
    p = Policy(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with pytest.raises(NotImplementedError): p._encode(['a'])
    with pytest.raises(NotImplementedError): p.decode(torch.zeros(1))
