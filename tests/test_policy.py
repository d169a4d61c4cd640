"Dense checks of flowgrpo_nb.policy on a small random tiny model (CPU, seconds)."
import pytest, torch
from flowgrpo_nb.tiny import TinyConfig, TinyFlowModel
from flowgrpo_nb.policy import Cond, NFECounter, Policy, TinyPolicy, LORA_TARGETS

torch.set_num_threads(1)
SMALL = dict(text_dim=32, text_heads=2, text_layers=1, pooled_dim=32, num_layers=2, num_heads=2, head_dim=16)


@pytest.fixture
def policy():
    torch.manual_seed(0)
    return TinyPolicy(TinyFlowModel(TinyConfig(**SMALL)))


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


def test_lora_save_load_roundtrip(policy, tmp_path):
    policy.add_lora(rank=3, alpha=5, targets=('to_q', 'to_v'))
    with torch.no_grad():
        for p in policy.trainable_parameters(): p.normal_()
    policy.save_lora(tmp_path)
    torch.manual_seed(0)
    other = TinyPolicy(TinyFlowModel(TinyConfig(**SMALL))).load_lora(tmp_path)
    assert other.lora_config == dict(rank=3, alpha=5, targets=['to_q', 'to_v'], dropout=0.0)
    x, c = policy.noise(2, torch.Generator().manual_seed(2)), policy.encode(['two squares'] * 2)
    with torch.no_grad():
        torch.testing.assert_close(other.velocity(x, 0.7, other.encode(['two squares'] * 2), 2.0),
                                   policy.velocity(x, 0.7, c, 2.0))
    wrong = TinyPolicy(TinyFlowModel(TinyConfig(**SMALL))).add_lora(rank=4)
    with pytest.raises(ValueError, match='differs'): wrong.load_lora(tmp_path)
    with pytest.raises(ValueError, match='no lora.safetensors'): wrong.load_lora(tmp_path / 'missing')


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
