"Checks of flowgrpo_nb.score: the dual encoder, hard negatives, training, save/load and the LearnedScore reward."
import json
import numpy as np, pytest, torch
from flowgrpo_nb.world import *
from flowgrpo_nb.score import *

torch.set_num_threads(1)

def test_tinyclip_shapes_and_size():
    m = TinyCLIP()
    assert sum(p.numel() for p in m.parameters()) * 4 < 1_000_000
    s = m(torch.rand(3, 3, 32, 32), ["a red circle", "", "two crosses"])
    assert s.shape == (3,) and (s.abs() <= 1 + 1e-5).all()
    with pytest.raises(ValueError, match="dim=30 must be a multiple of heads=4"): ScoreConfig(dim=30)
    with pytest.raises(ValueError, match="width=0"): ScoreConfig(width=0)

def test_edit_cells_kinds():
    rng = np.random.default_rng(0)
    for _ in range(200):
        cells = scenes_to_cells([sample_scene(all_prompts()[rng.integers(158)], rng)])[0]
        n, objs = int((cells > 0).sum()), sorted(cells[cells > 0].tolist())
        drop, move, rec, res, add = [edit_cells(cells, rng, k) for k in EDITS]
        assert (drop > 0).sum() == n - 1 and (add > 0).sum() == n + 1
        assert sorted(move[move > 0].tolist()) == objs and not torch.equal(move, cells)
        for e in (rec, res):
            i = (e != cells).nonzero().flatten()
            assert len(i) == 1 and e[i] > 0
        sr, cr = divmod(int(rec[rec != cells]) - 1, 4); s0, c0 = divmod(int(cells[rec != cells]) - 1, 4)
        assert sr == s0 and cr != c0
        ss, cs = divmod(int(res[res != cells]) - 1, 4); s1, c1 = divmod(int(cells[res != cells]) - 1, 4)
        assert ss != s1 and cs == c1
    with pytest.raises(ValueError, match="kind='swap'"): edit_cells(cells, rng, 'swap')

def test_score_batch_truth_matches_geneval():
    b = score_batch(24, np.random.default_rng(1), augment=False)
    assert b.images.shape == (48, 3, 32, 32) and b.truth.shape == (24, 48)
    assert (b.truth[:, :24].diagonal() == 1).all()
    for i in range(24):   # the exact truth of every pair equals mini-GenEval on the rendered image
        assert torch.equal(b.truth[i], mini_geneval(b.images, [b.prompts[i]] * 48).strict)
    assert (b.truth[:, 24:].diagonal() == 0).float().mean() > 0.3   # many edits break their prompt (about half)
    assert set(b.prompts) <= set(prompt_split('train'))

def test_train_save_load_round_trip(tmp_path):
    model, losses = train_score(steps=8, batch=16, seed=0, progress=False)
    assert len(losses) == 8 and np.isfinite(losses).all()
    save_score(model, tmp_path / 's.safetensors', {'note': 'test'})
    again = load_score(tmp_path / 's.safetensors')
    x, ps = sample_batch(5, 'train', np.random.default_rng(2))
    assert torch.allclose(model(x, ps), again(x, ps)) and again.meta['note'] == 'test'
    meta = json.loads((tmp_path / 's.json').read_text()); meta['vocab'] = meta['vocab'][:-1]
    (tmp_path / 's.json').write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="field 'vocab'"): load_score(tmp_path / 's.safetensors')
    with pytest.raises(ValueError, match="does not exist"): load_score(tmp_path / 'none.safetensors')

def test_learned_score_reward():
    score = LearnedScore(batch_size=3)
    x, ps = sample_batch(10, 'heldout', np.random.default_rng(3))
    out = score(x, ps)
    assert out.dtype == torch.float32 and out.shape == (10,)
    assert torch.allclose(out, LearnedScore(score.model)(x, ps), atol=1e-5)   # chunking does not change scores
    with pytest.raises(ValueError, match="unknown words"): score(x[:1], ["a pink circle"])
    with pytest.raises(ValueError, match="len\\(prompts\\)=1"): score(x[:2], ["a circle"])
    with pytest.raises(ValueError, match="images.shape"): score(torch.zeros(1, 3, 8, 8), ["a circle"])

def test_shipped_score_tracks_correctness():
    clip = load_score()
    acc = retrieval_accuracy(clip, 'heldout', n=256, seed=5)
    assert acc['retrieval'] > 0.7 and acc['pairwise'] > 0.8, acc
    corr = correlation(LearnedScore(clip), *perturbed_renders(300, 'heldout', seed=6))
    assert corr['partial']['spearman'] > 0.5, corr
