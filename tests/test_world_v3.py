"""The grid world's version 3 (issue 58, item 3): a held-out set in which every scored category has at least 24 distinct
prompts never trained on, beside version 2, which stays the default and reads as before."""
import dataclasses, json

import numpy as np
import pytest
import torch

from flowgrpo_nb import world as w2
from flowgrpo_nb.world import CATEGORIES, perturb
from flowgrpo_nb.worlds import World, world
from flowgrpo_nb.tiny import (ASSETS, TinyConfig, TinyFlowModel, load_tiny, pretrain, read_log, save_tiny,
                              shipped_path, tiny_meta)
from flowgrpo_nb.card import eval_prompts, scored_categories
from flowgrpo_nb.task import GRID_REWARDS, geneval_task, grid_world, load_task

torch.set_num_threads(1)
W3 = world(3)


def counts(w, split):
    out = {}
    for p in w.prompt_split(split): c = w.parse_prompt(p).category; out[c] = out.get(c, 0) + 1
    return out


def test_every_scored_share_has_24_distinct_heldout_prompts():
    held, train = W3.prompt_split('heldout'), set(W3.prompt_split('train'))
    assert len(held) == len(set(held)) and not set(held) & train          # distinct, never trained on
    c = counts(W3, 'heldout')
    assert set(c) == set(CATEGORIES) - {'single_object'} == set(scored_categories('heldout', 3))
    assert min(c.values()) >= 24, c
    words = {w for p in train for w in p.split()}
    binds = set().union(*[W3._bindings(p) for p in train])
    assert all(set(p.split()) <= words and W3._bindings(p) <= binds for p in held)   # compositions of trained parts
    assert sorted(held + sorted(train)) == sorted(W3.all_prompts())


def test_version_2_is_the_module_and_unchanged():
    "Version 2's split (237 held-out prompts, two two-object ones) is what results/confirm and results/credit used."
    assert world(2) is w2 and world() is w2 and w2.VERSION == 2
    c = counts(w2, 'heldout')
    assert sum(c.values()) == 237 and (c['two_object'], c['single_object'], c['colors']) == (2, 4, 5)
    assert len(w2.VOCAB) == 23 and len(W3.VOCAB) == 37
    with pytest.raises(ValueError, match='allowed: 2, 3'): world(4)
    with pytest.raises(ValueError, match="unknown words \\['tee'\\]"): w2.tokenize('a red tee')


def test_detector_reads_version_3_exactly_and_under_noise():
    im, pr, sc = W3.sample_batch(600, 'train', np.random.default_rng(5), return_scenes=True)
    assert W3.detect(im) == list(sc)
    res = W3.mini_geneval(im, pr)
    assert res.strict.mean() == 1 and res.partial.mean() == 1 and res.scenes == list(sc)
    noisy = perturb(im, 0.1, 0.6, generator=torch.Generator().manual_seed(0))
    assert (W3.detect_cells(noisy) == W3.scenes_to_cells(sc)).all(1).float().mean() >= 0.99
    shuffled = W3.mini_geneval(im, pr[1:] + pr[:1])
    assert shuffled.strict.mean() < 0.2


def test_version_3_task_and_rewards():
    assert grid_world('partial@3') == 3 and grid_world('partial') == 2
    assert {'partial@3', 'strict@3'} <= set(GRID_REWARDS)
    t = load_task('partial@3')
    assert t.name == 'geneval-partial@3' and t.eval_prompts == W3.prompt_split('heldout')
    assert min(t.prompt_counts().values()) >= 24 and len(t.prompt_counts()) == 5
    assert t.normalise(' A Cyan TEE. ') == 'a cyan tee'
    with pytest.raises(ValueError, match='tee'): geneval_task('partial').normalise('a tee')
    im, pr = W3.sample_batch(12, 'heldout', np.random.default_rng(0))
    assert torch.equal(t.reward(im, pr), torch.ones(12))
    rep = t.evaluate(im, pr)
    assert rep.overall == 1 and set(rep.extra) == {'partial'} and 'single_object' not in rep.categories


def test_eval_prompts_of_version_3_balanced_over_its_five_shares():
    ps = eval_prompts(50, seed=1, world=3)
    cats = [W3.parse_prompt(p).category for p in ps]
    assert set(ps) <= set(W3.prompt_split('heldout')) and all(cats.count(c) == 10 for c in set(cats))
    assert eval_prompts(60, seed=3) == eval_prompts(60, seed=3, world=2)


def test_tiny_model_of_version_3_saves_loads_and_pretrains(tmp_path, small_config):
    cfg = dataclasses.replace(small_config, vocab_size=len(W3.VOCAB))
    torch.manual_seed(0); m = TinyFlowModel(cfg, world=3)
    assert m.encode(['a magenta moon below a diamond'])[0].shape[:2] == (1, 8)
    save_tiny(m, tmp_path / 'm.safetensors', step=0)
    meta = json.loads((tmp_path / 'm.json').read_text())
    assert meta['world'] == 3 and meta['vocab'] == W3.VOCAB
    assert load_tiny(tmp_path / 'm.safetensors').world == 3
    with pytest.raises(ValueError, match="world=2: the checkpoint .* version 3"):
        load_tiny(tmp_path / 'm.safetensors', world=2)
    pretrain(tmp_path / 'run', steps=2, batch_size=4, warmup=1, save_every=2, config=cfg, progress=False, world=3)
    assert tiny_meta(tmp_path / 'run' / 'ema-000002.safetensors')['world'] == 3 and len(read_log(tmp_path / 'run')) == 2
    # version 2's records keep their form: no 'world' field
    torch.manual_seed(0); save_tiny(TinyFlowModel(small_config), tmp_path / 'v2.safetensors')
    assert 'world' not in json.loads((tmp_path / 'v2.json').read_text())


def test_config_backend_names_the_world_only_for_version_3():
    from flowgrpo_nb.config import GRPOConfig
    assert 'world' not in GRPOConfig(reward='partial').backend()
    assert GRPOConfig(reward='partial@3').backend()['world'] == 3


@pytest.mark.skipif(not shipped_path(3).exists(), reason='the version 3 base model is not shipped yet')
def test_shipped_version_3_model_and_card():
    from flowgrpo_nb.card import model_card
    m = load_tiny(world=3)
    assert m.world == 3 and tiny_meta(shipped_path(3))['world'] == 3
    assert (ASSETS / 'MODEL_CARD_v3.md').read_text() == model_card(world=3)
    assert shipped_path(3).stat().st_size < 15e6
    scores = tiny_meta(shipped_path(3))['scores']
    assert set(scores) - {'overall'} == set(scored_categories('heldout', 3))
    assert all(scores[c]['strict'] <= 0.9 for c in scores)   # room for RL in every share


def test_geneval3_is_a_task_of_the_study_not_the_main_jobs():
    from flowgrpo_nb.study.design import BUDGETS, TASKS, CompareConfig
    assert TASKS['geneval3']['reward'] == 'partial@3' and BUDGETS['default']['tasks'] == ('geneval',)
    c = CompareConfig(budget='smoke', tasks=('geneval3',))
    cfg = c.train_config('flow_grpo', 0, 'geneval3')
    assert cfg.reward == 'partial@3' and cfg.backend()['world'] == 3
    assert c.task_arms('geneval3') == CompareConfig(budget='smoke').task_arms('geneval')
    # run only when named: every budget's own tasks are as before
    assert CompareConfig().tasks == ('geneval',)
    assert CompareConfig(budget='smoke').tasks == CompareConfig(budget='quick').tasks == ('geneval', 'score')
