"""Checks of flowgrpo_nb.study.frontier (nbs/study/02b_frontier.ipynb shows the API) and `flowgrpo fidelity --frontier`:
the ranking's bookkeeping, the NFE of each pair, a learned value's branch through a stand-in, the command's flags."""
import inspect

import pytest, torch
from fastcore.script import anno_parser

import flowgrpo_nb.study.frontier as fr
from flowgrpo_nb.study.frontier import (FrontierConfig, frontier_fidelity, frontier_ranking, pareto, pair_nfe,
                                        source_nfe, frontier_sources, SOURCES)
from flowgrpo_nb.study.fidelity import FidelityConfig
from flowgrpo_nb.study.fidelity_report import fidelity_cli, frontier_markdown
from flowgrpo_nb.credit import compute_credit
from flowgrpo_nb.config import preset_config
from flowgrpo_nb.rollout import StepValues
from flowgrpo_nb.task import Task, load_policy

torch.set_num_threads(1)

def brightness(images, prompts): return images.mean((1, 2, 3))  # continuous: no ties hide errors

def _res(pairs:dict, taus:dict, diffs:dict) -> dict:
    "A frontier result by hand: pair -> (rule, source, nfe); its pooled tau; its difference from Flow-GRPO's."
    row = lambda n, t: dict(arm=n, quantity='advantage', step='all', kendall=t,
                            kendall_lo=None if t is None else t - .1, kendall_hi=None if t is None else t + .1,
                            spearman=t, kendall_nonzero=t, sign_agree=.5, zero_credit=0.)
    return dict(settings=dict(pairs={n: dict(rule=r, source=s, nfe_per_sample=f) for n, (r, s, f) in pairs.items()}),
                stats=[row(n, taus[n]) for n in pairs] + [dict(row('dense@tweedie', 0.9), quantity='reward')],
                differences=[dict(a=n, b='flow_grpo', quantity='advantage', stat='kendall', diff=d, lo=d - .2,
                                  hi=d + .2) for n, d in diffs.items()])

def test_pareto():
    assert pareto([10, 10, 55, 20, 279], [0.1, 0.3, 0.5, 0.2, 0.4]) == [False, True, True, False, False]
    assert pareto([10, 20, 20], [None, 0.1, float('nan')]) == [False, True, False]
    assert pareto([5, 5], [0.2, 0.2]) == [True, True]  # ties: neither beats the other

def test_ranking_bookkeeping():
    res = _res({'flow_grpo': ('flow_grpo', None, 10.), 'dense@tweedie': ('dense', 'tweedie', 10.),
                'dense@ode:rest': ('dense', 'ode:rest', 55.), 'stepwise@ode:2': ('stepwise', 'ode:2', 20.),
                'tempflow': ('tempflow', None, 279.)},
               {'flow_grpo': 0.2, 'dense@tweedie': 0.1, 'dense@ode:rest': 0.5, 'stepwise@ode:2': None, 'tempflow': 0.4},
               {'dense@tweedie': -0.1, 'dense@ode:rest': 0.3, 'tempflow': 0.2})
    rank = frontier_ranking(res)
    assert [r['pair'] for r in rank] == ['dense@ode:rest', 'tempflow', 'flow_grpo', 'dense@tweedie', 'stepwise@ode:2']
    by = {r['pair']: r for r in rank}
    assert [n for n in by if by[n]['frontier']] == ['dense@ode:rest', 'flow_grpo']
    assert by['dense@ode:rest']['kendall'] == 0.5 and by['dense@ode:rest']['nfe_per_sample'] == 55
    assert (by['tempflow']['vs_flow_grpo'], by['tempflow']['vs_flow_grpo_lo']) == (0.2, 0.0)
    assert by['flow_grpo']['vs_flow_grpo'] is None and by['dense@tweedie']['source'] == 'tweedie'
    md = frontier_markdown(res).splitlines()
    assert len(md) == 2 + 5 and md[2].startswith('| dense@ode:rest | 55 | +0.500 [+0.400, +0.600] | +0.300')
    assert '| n/a |' in md[-1]  # a pair without a tau says so

def test_pair_nfe_matches_each_methods_price():
    base = preset_config('flow_grpo')  # K = 10, the window 0..8
    assert pair_nfe('dense', 'ode:rest', base, 8) == preset_config('dense').K + 45 == 55
    assert pair_nfe('turning_point', 'ode:2', base, 8) == 10 + 10
    assert pair_nfe('stepwise', 'tweedie', base, 8) == pair_nfe('flow_grpo', None, base, 8) == 10
    assert pair_nfe('dense', 'latent', base, 8) == 10 and source_nfe('latent', base.rollout_config()) == 0
    assert pair_nfe('tempflow', None, preset_config('tempflow'), 4) == 279

def test_config_errors():
    with pytest.raises(ValueError, match="FrontierConfig.rules=.*allowed a non-empty subset"): FrontierConfig(rules=())
    with pytest.raises(ValueError, match="sources: 'ode:x' is not a value source"): FrontierConfig(sources=['ode:x'])
    with pytest.raises(ValueError, match='value_epochs'): FrontierConfig(value_epochs=0)
    assert frontier_sources()[:len(SOURCES)] == SOURCES

class StandInValue:
    "A learned value by the contract (`predict(policy, rollout) -> [B, K]`): the states' mean brightness, recorded."
    def __init__(self): self.seen = []
    def predict(self, policy, ro):
        V = ro.x[:, :ro.K].mean((2, 3, 4)).cpu()
        self.seen.append((ro, V))
        return V

def _contract_step_values(real):
    "`step_values` as the latent branch defines it, for a copy of the package that predates it."
    def step_values(policy, ro, op, reward_fn, cfg=None, keep_images=False, value=None):
        if op != 'latent': return real(policy, ro, op, reward_fn, cfg, keep_images)
        V = torch.cat([value.predict(policy, ro).to(ro.reward), ro.reward[:, None]], 1)
        return StepValues(V, 'latent', 0, 0, 0)
    return step_values

def test_frontier_with_a_learned_value(monkeypatch):
    "The 'latent' source on the same rollouts: its values are the value's, its credit the rule's on them, 0 NFE."
    monkeypatch.setattr(fr, 'latent_available', lambda: True)
    if 'value' not in inspect.signature(fr.step_values).parameters:
        monkeypatch.setattr(fr, 'step_values', _contract_step_values(fr.step_values))
    task, value = Task('brightness', ['a red circle', 'two squares'], ['a green square'], brightness), StandInValue()
    cfg = FidelityConfig(prompts=2, batch_prompts=2, group=2, M=2, K=4, n_boot=20)
    front = FrontierConfig(sources=['tweedie', 'latent'], tempflow=False)
    res = frontier_fidelity(load_policy('tiny'), task, cfg, front, value=value)
    pairs = res['settings']['pairs']
    assert list(pairs) == ['dense@tweedie', 'dense@latent', 'turning_point@tweedie', 'turning_point@latent',
                           'stepwise@tweedie', 'stepwise@latent', 'flow_grpo']
    assert pairs['dense@latent']['nfe_per_sample'] == 4 and res['cost']['sources']['latent']['nfe_per_sample'] == 0
    assert res['cost']['sources']['tweedie']['nfe_per_sample'] == 0 and 'value_fit' not in res['cost']['phases']
    (ro, V), = value.seen  # one batch: predicted once, read by every rule
    want = compute_credit(torch.cat([V, ro.reward.cpu()[:, None]], 1), ro.group.cpu(), ro.trained.cpu(),
                          preset_config('dense', K=4).credit_config())
    torch.testing.assert_close(torch.tensor(res['data']['dense@latent']['advantages']), want.advantages)
    truth = res['data']['flow_grpo']['truth']
    assert all(d['truth'] == truth for d in res['data'].values())  # one truth: the same rollouts
    assert len(frontier_ranking(res)) == 7 and res['value_error']['latent']['step'] == [0, 1, 2]

def test_cli_frontier_flags():
    fn = getattr(fidelity_cli, '__wrapped__', fidelity_cli)
    a = anno_parser(fn).parse_args(['--frontier', '--sources', 'tweedie,ode:rest', '-m', '4'])
    assert (a.frontier, a.sources, a.M) == (True, 'tweedie,ode:rest', 4)
    with pytest.raises(ValueError, match='--frontier measures the base model'): fn(frontier=True, run='r')
    with pytest.raises(ValueError, match="sources: 'ode:0'"): fn(frontier=True, sources='ode:0', out=None)
