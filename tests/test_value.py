"""The learned latent value (05g_value): every rule takes every step-value source, the latent one at Flow-GRPO's
generator NFE, and the value works as a head on the diffusers backends' latents and pooled prompt embeddings (tiny
random SD3 and FLUX, nothing downloaded)."""
import pytest, torch
from flowgrpo_nb.config import preset_config
from flowgrpo_nb.method import method_of
from flowgrpo_nb.rollout import RolloutConfig, rollout, step_values
from flowgrpo_nb.policy import seeded_generator
from flowgrpo_nb.value import LatentValue, ValueConfig, value_files, load_value, value_step

torch.set_num_threads(1)
SOURCES = ('tweedie', 'ode:2', 'ode:rest', 'latent')

@pytest.mark.parametrize('preset', ['dense', 'turning_point', 'stepwise'])
@pytest.mark.parametrize('source', SOURCES)
def test_every_rule_takes_every_source(preset, source):
    "`--set lookahead=...` on each rule's preset validates, and the registry prices it: the latent one at K NFE."
    cfg = preset_config(preset, lookahead=source)
    nfe = method_of(cfg.method).nfe(cfg)
    assert cfg.lookahead == source and nfe >= cfg.K
    assert (nfe == cfg.K) == (source in ('tweedie', 'latent'))

@pytest.mark.parametrize('preset', ['dense_latent', 'turning_point_latent', 'stepwise_latent'])
def test_latent_presets_cost_flow_grpos_generator_nfe(preset):
    "The acceptance: a latent-valued rule's generator NFE per training sample is at most 1.2x Flow-GRPO's."
    flow, cfg = preset_config('flow_grpo'), preset_config(preset)
    assert cfg.lookahead == 'latent'
    assert method_of(cfg.method).nfe(cfg) <= 1.2 * method_of(flow.method).nfe(flow)

def test_a_config_value_refuses_bad_sizes():
    with pytest.raises(ValueError, match='value_hidden'): preset_config('dense_latent', value_hidden=0)
    with pytest.raises(ValueError, match='value_lr'): preset_config('dense_latent', value_lr=0.0)

@pytest.mark.parametrize('backend', ['sd3', 'flux'])
def test_the_value_is_a_head_on_diffusers_latents(backend, request, tmp_path):
    """On a tiny random pipeline: the value reads the backend's latents and pooled prompt embedding, values a rollout
    at no generator NFE, fits (finite loss) and its weights and optimizer come back bitwise from its files."""
    policy = request.getfixturevalue(f'make_{backend}')()
    reward = lambda images, prompts: images.float().mean((1, 2, 3))
    cfg = RolloutConfig(K=2, shift=getattr(policy, 'shift', 1.0), guidance=3.5, group_size=2)
    ro = rollout(policy, ['a red apple', 'two cats'], cfg, reward, torch.Generator().manual_seed(0))
    value = LatentValue.for_policy(policy, ValueConfig(hidden=4, grid=2, minibatch=4))
    with policy.count_nfe('lookahead') as n:
        sv = step_values(policy, ro, 'latent', reward, value=value)
    assert n['nfe'] == 0 and sv.nfe == 0 and sv.V.shape == (4, 3) and torch.equal(sv.V[:, 2], ro.reward)
    stats = value_step(value, policy, ro, sv.V, 0, 0)
    assert all(torch.isfinite(torch.tensor(v)) for k, v in stats.items() if k != 'value_ev') and stats['nfe_value'] > 0
    again = LatentValue.for_policy(policy, ValueConfig(hidden=4, grid=2, minibatch=4))
    load_value(again, value_files(value), 'ckpt')
    assert all(torch.equal(a, b) for a, b in zip(value.state_dict().values(), again.state_dict().values()))
    assert torch.equal(again.predict(policy, ro), value.predict(policy, ro))
