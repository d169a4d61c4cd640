"Dense checks of flowgrpo_nb.world: detector exactness and robustness, scene sampling, mini-GenEval semantics, splits."
import hashlib, itertools, time
import numpy as np, pytest, torch
from flowgrpo_nb.world import *
from flowgrpo_nb.world import _words, _composition, _bindings

torch.set_num_threads(1)

def random_cells(n, rng, p_empty=0.6):
    "Random cell grids [n, 16]: each cell empty with probability p_empty, else a uniform glyph."
    glyph = torch.from_numpy(rng.integers(1, N_CLASSES, size=(n, GRID * GRID)))
    return torch.where(torch.from_numpy(rng.random((n, GRID * GRID)) < p_empty), 0, glyph)

# --- rendering and the detector --------------------------------------------------------------------------------

def test_render_range_and_shape():
    x = render_cells(random_cells(64, np.random.default_rng(0)))
    assert x.shape == (64, 3, SIZE, SIZE) and x.dtype == torch.float32
    assert set(x.unique().tolist()) <= {0., 1.}

def test_detector_exact_on_rendered_scenes():
    rng = np.random.default_rng(1)
    for p_empty in (0.0, 0.5, 0.9):
        cells = random_cells(3000, rng, p_empty)
        assert torch.equal(detect_cells(render_cells(cells)), cells)
    images, prompts, scenes = sample_batch(3000, 'train', rng, return_scenes=True)
    assert detect(images) == scenes

def test_scene_round_trip():
    cells = random_cells(500, np.random.default_rng(2))
    scenes = cells_to_scenes(cells)
    assert torch.equal(scenes_to_cells(scenes), cells)
    assert detect(render(scenes)) == scenes

@pytest.mark.parametrize("noise,blur,clip", [(0.1, 0., True), (0.2, 0., True), (0.2, 0., False), (0.1, 0.5, True),
                                             (0.2, 0.5, True), (0.15, 0.7, True), (0.1, 0.7, False)])
def test_detector_robust(noise, blur, clip):
    cells = random_cells(2000, np.random.default_rng(3), 0.5)
    x = perturb(render_cells(cells), noise, blur, clip=clip, generator=torch.Generator().manual_seed(4))
    assert torch.equal(detect_cells(x), cells)

def test_detector_out_of_range_and_dim():
    cells = random_cells(1000, np.random.default_rng(5))
    x = render_cells(cells)
    assert torch.equal(detect_cells(x * 1.15 - 0.05), cells)   # slightly out of [0, 1]
    for dim in (0.4, 0.5, 0.7): assert torch.equal(detect_cells(x * dim), cells)  # dim glyphs are still glyphs
    assert torch.equal(detect_cells(perturb(x * 0.7, 0.1, 0.5, generator=torch.Generator().manual_seed(0))), cells)
    assert (detect_cells(x * 0.2) == 0).all()                  # mostly dark cells are empty

def test_detector_rejects_bad_shape():
    with pytest.raises(ValueError, match=r"images.shape=\(2, 3, 16, 16\)"): detect(torch.zeros(2, 3, 16, 16))

def test_detector_fast():
    x = render_cells(random_cells(4000, np.random.default_rng(6)))
    t0 = time.perf_counter(); detect_cells(x); dt = time.perf_counter() - t0
    assert 4000 / dt > 2000, f"{4000 / dt:.0f} images/s"

def test_glyphs_well_separated():
    m = torch.stack([glyph_mask(s) for s in SHAPES]).flatten(1)
    d = torch.cdist(m, m, p=1)
    assert d[~torch.eye(4, dtype=bool)].min() >= 12
    assert (glyph_mask('square')[[0, -1]] == 0).all() and (glyph_mask('square')[:, [0, -1]] == 0).all()  # margins

# --- prompts, tokens and the grammar -----------------------------------------------------------------------------

def test_tokenize_round_trip_all_prompts():
    ps = all_prompts() + ['']
    toks = tokenize(ps)
    assert toks.shape == (len(ps), MAX_WORDS) and toks.dtype == torch.long
    assert detokenize(toks) == ps
    assert toks[-1].sum() == 0
    assert max(len(_words(p)) for p in all_prompts()) == MAX_WORDS
    assert VOCAB[0] == '<pad>' and len(set(VOCAB)) == len(VOCAB)

def test_unknown_words_error():
    with pytest.raises(ValueError) as e: tokenize(["a red circle", "a magenta hexagon"])
    msg = str(e.value)
    assert "['hexagon', 'magenta']" in msg and 'prompt := "a SHAPE"' in msg
    with pytest.raises(ValueError, match="unknown words"): parse_prompt("a magenta circle")
    with pytest.raises(ValueError, match="unknown words"): mini_geneval(torch.zeros(1, 3, 32, 32), ["a pink circle"])
    with pytest.raises(ValueError, match="<pad>"): tokenize(["<pad>"])
    with pytest.raises(ValueError, match="MAX_WORDS"): tokenize(["a red circle and a blue square and a cross"])

def test_grammar_errors():
    for bad in ["circle", "a circle and a circle", "a red circle and a red square", "a circle left a square",
                "two circle", "one circle", "a circle above of a square", ""]:
        with pytest.raises(ValueError, match="grammar"): parse_prompt(bad)

def test_parse_all_prompts():
    counts = {'single_object': 4, 'two_object': 6, 'counting': 60, 'colors': 16, 'position': 624, 'color_attr': 72}
    for c, n in counts.items():
        ps = all_prompts(c)
        assert len(ps) == n == len(set(ps))
        assert all(parse_prompt(p).category == c for p in ps)
    assert parse_prompt("A Red Circle").prompt == "a red circle"
    with pytest.raises(ValueError, match="category='shapes'"): all_prompts('shapes')

# --- splits -----------------------------------------------------------------------------------------------------

def test_splits():
    train, held = prompt_split('train'), prompt_split('heldout')
    single = set(all_prompts('single_object'))
    assert set(train) & set(held) == single and set(train) | set(held) == set(all_prompts())
    assert len(held) >= 200  # enough prompts for prompt-clustered standard errors
    for c in CATEGORIES[1:]:
        n_held = sum(parse_prompt(p).category == c for p in held)
        assert abs(n_held / len(all_prompts(c)) - 0.3) < 0.1, c
    # held-out compositions never appear in training (position: "A left of B" == "B right of A")
    assert not ({_composition(p) for p in held if p not in single} & {_composition(p) for p in train})
    # every word of a category's held-out prompts is in its training prompts; every colour binding in training
    binds = set().union(*[_bindings(p) for p in train])
    for c in CATEGORIES:
        words = {w for p in train if parse_prompt(p).category == c for w in _words(p)}
        for p in held:
            if parse_prompt(p).category == c: assert set(_words(p)) <= words and _bindings(p) <= binds, p
    with pytest.raises(ValueError, match="split='test'"): prompt_split('test')

def test_split_is_frozen():
    "The split must never change: the tiny model is pretrained on it."
    h = hashlib.sha256('\n'.join(prompt_split('heldout')).encode()).hexdigest()[:16]
    assert h == HELDOUT_SHA, h

HELDOUT_SHA = 'b75589069d614357'

# --- scene sampling and mini-GenEval ------------------------------------------------------------------------------

def test_sampled_scenes_satisfy_their_prompt():
    rng = np.random.default_rng(7)
    prompts = [p for p in all_prompts() for _ in range(20)]
    scenes = [sample_scene(p, rng) for p in prompts]
    for p, s in zip(prompts, scenes):
        spec = parse_prompt(p)
        assert len(s) == (spec.count or len(spec.shapes)), (p, s)
        assert sorted(o.shape for o in s) == sorted(spec.shapes * (spec.count or 1))
    r = mini_geneval(render(scenes), prompts)
    assert r.strict.min() == 1 and r.partial.min() == 1
    assert r.categories == [parse_prompt(p).category for p in prompts]

def test_sample_batch_balance_and_split():
    rng = np.random.default_rng(8)
    x, ps = sample_batch(3000, 'heldout', rng)
    assert set(ps) <= set(prompt_split('heldout'))
    cats = [parse_prompt(p).category for p in ps]
    assert all(abs(cats.count(c) / 3000 - 1 / 6) < 0.03 for c in CATEGORIES)
    _, ps = sample_batch(3000, 'train', rng, balance='prompt')
    assert sum(parse_prompt(p).category == 'position' for p in ps) / 3000 > 0.6  # position has most prompts
    with pytest.raises(ValueError, match="balance='x'"): sample_batch(2, balance='x')

def reference_geneval(scene, prompt):
    "Slow, literal mini-GenEval of one scene: (strict, partial). Nothing else: the scene holds only objects asked for."
    s = parse_prompt(prompt)
    A = [o for o in scene if o.shape == s.shapes[0]]
    Ac = [o for o in A if s.colours[0] in (None, o.colour)]
    if s.category == 'counting':
        alone = len(scene) == len(Ac)
        n = len(Ac); return float(n == s.count and alone), (max(0., 1 - abs(n - s.count) / s.count) + alone) / 2
    if s.category in ('single_object', 'colors'):
        alone = len(scene) == len(Ac) <= 1  # no object but the one asked for (its absence is another constraint)
        c = [bool(A), bool(Ac), alone] if s.colours[0] else [bool(A), alone]
    else:
        B = [o for o in scene if o.shape == s.shapes[1]]
        Bc = [o for o in B if s.colours[1] in (None, o.colour)]
        alone = len(scene) == len(Ac) + len(Bc) and len(Ac) <= 1 and len(Bc) <= 1
        coloured = [bool(Ac), bool(Bc)] if s.colours[0] else []
        if s.category == 'two_object': c = [bool(A), bool(B), alone]
        elif s.category == 'color_attr': c = [bool(A), bool(B), *coloured, alone]
        else:
            rel = {'left of': lambda a, b: a.col < b.col, 'right of': lambda a, b: a.col > b.col,
                   'above': lambda a, b: a.row < b.row, 'below': lambda a, b: a.row > b.row}[s.relation]
            c = [bool(A), bool(B), *coloured, any(rel(a, b) for a in Ac for b in Bc), alone]
    return float(all(c)), sum(c) / len(c)

def test_mini_geneval_matches_reference():
    rng = np.random.default_rng(9)
    ps = all_prompts()
    # scenes of random other prompts, random grids, and scenes of the right prompt: all three kinds of outcomes
    prompts = [ps[i] for i in rng.integers(len(ps), size=3000)]
    scenes = ([sample_scene(ps[i], rng) for i in rng.integers(len(ps), size=1000)] +
              cells_to_scenes(random_cells(1000, rng, 0.75)) + [sample_scene(p, rng) for p in prompts[2000:]])
    r = mini_geneval(render(scenes), prompts)
    ref = torch.tensor([reference_geneval(s, p) for s, p in zip(scenes, prompts)])
    assert torch.equal(r.strict, ref[:, 0])
    assert torch.allclose(r.partial, ref[:, 1].float(), atol=1e-6)
    assert 0 < r.strict[:2000].mean() < 0.6 and (r.strict[2000:] == 1).all() and (r.partial >= r.strict).all()
    assert r.scenes == scenes

def test_reward_callable():
    rng = np.random.default_rng(10)
    x, ps = sample_batch(16, 'train', rng)
    for kind in ('strict', 'partial'):
        out = MiniGenEvalReward(kind)(x, ps)
        assert out.dtype == torch.float32 and out.shape == (16,) and (out == 1).all()
    with pytest.raises(ValueError, match="len\\(prompts\\)=3"): mini_geneval(x, ps[:3])
    with pytest.raises(ValueError, match="kind='x'"): MiniGenEvalReward('x')

def test_geneval_report():
    strict = torch.tensor([1., 0., 1., 1.]); cats = ['counting', 'counting', 'colors', 'colors']
    rep = geneval_report(strict, cats).to_dict()
    assert rep['counting']['strict'] == 0.5 and rep['colors']['strict'] == 1.0
    assert abs(rep['counting']['strict_se'] - 0.5) < 1e-9   # std([1, 0]) / sqrt(2)
    assert rep['overall']['strict'] == 0.75 and rep['overall']['n'] == 4
    with pytest.raises(ValueError, match="categories"): geneval_report(strict)
    rng = np.random.default_rng(11)
    x, ps = sample_batch(60, 'train', rng)
    r = mini_geneval(x, ps)
    rep = geneval_report([r, r])
    assert rep.overall['strict'] == 1 and sum(row['n'] for row in rep.rows) == 120
    assert '| overall |' in rep._repr_markdown_()
